/* tool_bench_cuda.c — the CUDA backend's step times on a real GPU, through its ops alone
 * (no engine, no HTTP): what scripts/gpu-check.sh reports for issue 9's targets.
 *
 *   build/tests/tool_bench_cuda MODEL [--dummy] [--kv-cache-dtype bf16|fp8]
 *        [--max-model-len N] [--max-num-seqs N] [--max-num-batched-tokens N]
 *        [--gpu-memory-utilization F] [--context N] [--steps N] [--enforce-eager]
 *        [--quantization q8_0] [--profile]
 *
 * Loads MODEL (--dummy: a config-only HF directory with random weights, the
 * --load-format dummy of tessera serve; --quantization q8_0: its matrices quantized to
 * Q8_0 at load, as tessera serve -q q8_0 does), creates the backend from $TESSERA_CUDA_LIB
 * (default build/libtessera-cuda.so), and measures:
 *   - decode steps at batch 1, 8, 64 and 256 over --context tokens of context each,
 *     pipelined as the engine runs them: the next step's batch is built (its tokens named
 *     by BACKEND_TOKEN_PREV) while the GPU runs the current one; step time = wall time per
 *     step; GPU idle = the backend's event-timed gap between the end of one step and the
 *     start of the next, as a share of the step;
 *   - one 1,024-token prefill step with sampling (TTFT without HTTP and tokenizer);
 *   - one mixed step: up to 64 sequences of --context tokens decode a row each beside a
 *     1,024-token prompt (how a server's steps look while prompts arrive), and its excess
 *     over the prefill alone;
 * and prints one table with the targets of docs/cuda-backend.md. --profile: after each
 * decode batch's run (1, 8, 64, 256), the forward of its last step again, kernel by kernel
 * (tessera_cuda_profile_forward, src/backend/cuda/profile.h: eager, kernels back to back),
 * as one table per batch after the main one.
 */
#define _GNU_SOURCE
#include "backend/backend_impl.h"
#include "backend/cuda/profile.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "util/err.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static backend_create_fn g_create;
static void (*g_timing)(void *, int, double *, double *, long *);
static tessera_cuda_profile_fn g_profile;

/* Batch arrays for up to n sequences of one row (decode) or one sequence of n rows. */
struct arrays {
    int32_t *tok, *pos, *qs, *lens, *bt, *li;
    int64_t *slot;
    struct backend_sample *smp;
    struct backend_token *out;
};

static int arrays_alloc(struct arrays *a, int n, int max_blocks)
{
    a->tok = calloc((size_t)n, 4);
    a->pos = calloc((size_t)n, 4);
    a->qs = calloc((size_t)n + 1, 4);
    a->lens = calloc((size_t)n, 4);
    a->bt = calloc((size_t)n * (size_t)max_blocks, 4);
    a->li = calloc((size_t)n, 4);
    a->slot = calloc((size_t)n, 8);
    a->smp = calloc((size_t)n, sizeof *a->smp);
    a->out = calloc((size_t)n, sizeof *a->out);
    return a->tok && a->pos && a->qs && a->lens && a->bt && a->li && a->slot && a->smp && a->out ? 0 : -1;
}

static void arrays_free(struct arrays *a)
{
    free(a->tok);
    free(a->pos);
    free(a->qs);
    free(a->lens);
    free(a->bt);
    free(a->li);
    free(a->slot);
    free(a->smp);
    free(a->out);
}


struct bench {
    const struct backend_ops *ops;
    void *impl;
    struct backend_info info;
    int vocab, bs, max_blocks;
    struct sampler *greedy;
};

#define PROFILE_ROWS 32
struct profile {
    int rows;      /* < 0: not run */
    double forward_ms;
    struct tessera_cuda_profile_row row[PROFILE_ROWS];
};

/* The last step's forward, kernel by kernel (5 runs averaged). */
static void run_profile(struct bench *b, struct profile *p, char *err, size_t errlen)
{
    p->rows = g_profile(b->impl, 5, p->row, PROFILE_ROWS, &p->forward_ms, err, errlen);
}

static void print_profile(const char *what, const struct profile *p, double step_ms)
{
    if (p->rows < 0) return;
    printf("\nforward profile, %s: %.3f ms with kernels back to back (eager, events between them) "
           "against a %.3f ms step\n", what, p->forward_ms, step_ms);
    printf("%-40s %6s %12s %8s\n", "kernel", "calls", "us/forward", "share");
    for (int i = 0; i < p->rows; i++)
        printf("%-40s %6d %12.1f %7.1f%%\n", p->row[i].name, p->row[i].calls, 1e3 * p->row[i].ms,
               p->forward_ms > 0 ? 100 * p->row[i].ms / p->forward_ms : 0);
}

/* Prefills `ctx` tokens for each of sequences 0 .. n-1, one after another, in chunks of up
 * to max_tokens rows per step, through x (max_tokens rows). Sequence s owns blocks
 * [s * max_blocks, ...). Returns 0 or the backend's error. */
static int prefill_seqs(struct bench *b, struct arrays *x, int n, int ctx, int max_tokens, char *err, size_t errlen)
{
    for (int s = 0; s < n; s++) {
        for (int p0 = 0; p0 < ctx; p0 += max_tokens) {
            int T = ctx - p0 < max_tokens ? ctx - p0 : max_tokens;
            for (int t = 0; t < T; t++) {
                int p = p0 + t;
                x->tok[t] = (int32_t)((p * 7919 + s * 104729) % b->vocab);
                x->pos[t] = p;
                x->slot[t] = (int64_t)(s * b->max_blocks + p / b->bs) * b->bs + p % b->bs;
            }
            for (int k = 0; k < b->max_blocks; k++) x->bt[k] = s * b->max_blocks + k;
            x->qs[0] = 0;
            x->qs[1] = T;
            x->lens[0] = p0 + T;
            x->li[0] = T - 1;
            x->smp[0] = (struct backend_sample){ .sampler = b->greedy, .n_logprobs = -1 };
            struct batch pb = { T, 1, x->tok, x->pos, x->slot, x->qs, x->lens, x->bt, b->max_blocks, 1, x->li };
            int rc = b->ops->submit(b->impl, &pb, x->smp, err, errlen);
            if (rc || (rc = b->ops->wait(b->impl, x->out, err, errlen))) return rc;
        }
    }
    return 0;
}

/* Prefills `ctx` tokens for each of n sequences (prefill_seqs), then runs `steps` pipelined
 * decode steps. Returns the mean decode step in ms and the GPU idle share, or -1. */
static double run_decode(struct bench *b, int n, int ctx, int steps, int max_tokens, double *idle_share, char *err,
                         size_t errlen)
{
    struct arrays a[2]; /* the step in flight borrows one set while the next is built in the other */
    double result = -1;
    memset(a, 0, sizeof a);
    if (arrays_alloc(&a[0], max_tokens > n ? max_tokens : n, b->max_blocks) || arrays_alloc(&a[1], n, b->max_blocks))
        goto done;
    if (prefill_seqs(b, &a[0], n, ctx, max_tokens, err, errlen)) goto done;
    /* decode: every sequence one row, its token the previous step's sample */
    for (int i = 0; i < 2; i++) {
        for (int s = 0; s < n; s++) {
            for (int k = 0; k < b->max_blocks; k++) a[i].bt[(size_t)s * b->max_blocks + k] = s * b->max_blocks + k;
            a[i].qs[s] = s;
            a[i].li[s] = s;
            a[i].smp[s] = (struct backend_sample){ .sampler = b->greedy, .n_logprobs = -1 };
        }
        a[i].qs[n] = n;
    }
    double t0 = 0;
    for (int step = 0; step <= steps; step++) {
        if (step == 1) { /* the first decode step (its tokens come from a prefill) is warm-up */
            g_timing(b->impl, 1, NULL, NULL, NULL);
            t0 = now_ms();
        }
        struct arrays *x = &a[step & 1];
        const int p = ctx + step;
        for (int s = 0; s < n; s++) {
            x->tok[s] = step == 0 ? 1 : BACKEND_TOKEN_PREV(s);
            x->pos[s] = p;
            x->lens[s] = p + 1;
            x->slot[s] = (int64_t)(s * b->max_blocks + p / b->bs) * b->bs + p % b->bs;
        }
        struct batch db = { n, n, x->tok, x->pos, x->slot, x->qs, x->lens, x->bt, b->max_blocks, n, x->li };
        /* the batch was built while the previous step ran; now its tokens, then the next step */
        if (step > 0 && b->ops->wait(b->impl, a[(step - 1) & 1].out, err, errlen)) goto done;
        if (b->ops->submit(b->impl, &db, x->smp, err, errlen)) goto done;
    }
    if (b->ops->wait(b->impl, a[steps & 1].out, err, errlen)) goto done;
    result = (now_ms() - t0) / steps;
    double busy, idle;
    long ts;
    g_timing(b->impl, 1, &busy, &idle, &ts);
    *idle_share = busy + idle > 0 ? idle / (busy + idle) : 0;
done:
    arrays_free(&a[0]);
    arrays_free(&a[1]);
    return result;
}

/* One step of batch bt (samples and outputs in a), waited for: its wall time in ms, or -1
 * on an error (in err). */
static double step_ms(struct bench *b, const struct batch *bt, struct arrays *a, char *err, size_t errlen)
{
    const double t0 = now_ms();
    if (b->ops->submit(b->impl, bt, a->smp, err, errlen) || b->ops->wait(b->impl, a->out, err, errlen)) return -1;
    return now_ms() - t0;
}

/* Repetition rep's time ms into *best (the best of the repetitions after the first, a
 * warm-up). Returns non-zero, *best = -1, on a failed step (ms < 0). */
static int keep_best(double *best, double ms, int rep)
{
    if (ms < 0) {
        *best = -1;
        return 1;
    }
    if (rep > 0 && (*best < 0 || ms < *best)) *best = ms;
    return 0;
}

/* A mixed step as a server's scheduler makes them while prompts arrive: n sequences of
 * ctx tokens (prefill_seqs) decode one row each, and sequence n's whole prompt of len
 * tokens follows them in the same step (logits for every decode row and the prompt's
 * last). Returns the best of 3 steps (after a warm-up; each waited for) in ms, or -1. */
static double run_mixed(struct bench *b, int n, int ctx, int len, int max_tokens, char *err, size_t errlen)
{
    struct arrays a;
    double best = -1;
    if (arrays_alloc(&a, n + len > max_tokens ? n + len : max_tokens, b->max_blocks)) return -1;
    if (prefill_seqs(b, &a, n, ctx, max_tokens, err, errlen)) goto done;
    for (int rep = 0; rep < 4; rep++) {
        for (int s = 0; s <= n; s++) {
            for (int k = 0; k < b->max_blocks; k++) a.bt[(size_t)s * b->max_blocks + k] = s * b->max_blocks + k;
            a.smp[s] = (struct backend_sample){ .sampler = b->greedy, .n_logprobs = -1 };
        }
        for (int s = 0; s < n; s++) { /* each repetition writes the same decode position again */
            a.tok[s] = (int32_t)((s * 31 + 7) % b->vocab);
            a.pos[s] = ctx;
            a.slot[s] = (int64_t)(s * b->max_blocks + ctx / b->bs) * b->bs + ctx % b->bs;
            a.qs[s] = s;
            a.lens[s] = ctx + 1;
            a.li[s] = s;
        }
        for (int t = 0; t < len; t++) {
            a.tok[n + t] = (int32_t)((t * 7919 + rep) % b->vocab);
            a.pos[n + t] = t;
            a.slot[n + t] = (int64_t)(n * b->max_blocks + t / b->bs) * b->bs + t % b->bs;
        }
        a.qs[n] = n;
        a.qs[n + 1] = n + len;
        a.lens[n] = len;
        a.li[n] = n + len - 1;
        struct batch mb = { n + len, n + 1, a.tok, a.pos, a.slot, a.qs, a.lens, a.bt, b->max_blocks, n + 1, a.li };
        if (keep_best(&best, step_ms(b, &mb, &a, err, errlen), rep)) break;
    }
done:
    arrays_free(&a);
    return best;
}

static double run_prefill(struct bench *b, int len, char *err, size_t errlen)
{
    struct arrays a;
    double best = -1;
    if (arrays_alloc(&a, len, b->max_blocks)) return -1;
    for (int rep = 0; rep < 4; rep++) { /* best of 3 after a warm-up */
        for (int t = 0; t < len; t++) {
            a.tok[t] = (int32_t)((t * 7919 + rep) % b->vocab);
            a.pos[t] = t;
            a.slot[t] = (int64_t)(t / b->bs) * b->bs + t % b->bs;
        }
        for (int k = 0; k < b->max_blocks; k++) a.bt[k] = k;
        a.qs[0] = 0;
        a.qs[1] = len;
        a.lens[0] = len;
        a.li[0] = len - 1;
        a.smp[0] = (struct backend_sample){ .sampler = b->greedy, .n_logprobs = -1 };
        struct batch pb = { len, 1, a.tok, a.pos, a.slot, a.qs, a.lens, a.bt, b->max_blocks, 1, a.li };
        if (keep_best(&best, step_ms(b, &pb, &a, err, errlen), rep)) break;
    }
    arrays_free(&a);
    return best;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *kv = "auto";
    bool dummy = false, eager = false, q8_0 = false, profile = false;
    int max_model_len = 4096, max_seqs = 256, max_tokens = 8192, ctx = 1024, steps = 64;
    double util = 0.9;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dummy")) dummy = true;
        else if (!strcmp(a, "--enforce-eager")) eager = true;
        else if (!strcmp(a, "--profile")) profile = true;
        else if (!strcmp(a, "--quantization") && v && !strcmp(v, "q8_0")) q8_0 = true, i++;
        else if (!strcmp(a, "--kv-cache-dtype") && v) kv = argv[++i];
        else if (!strcmp(a, "--max-model-len") && v) max_model_len = atoi(argv[++i]);
        else if (!strcmp(a, "--max-num-seqs") && v) max_seqs = atoi(argv[++i]);
        else if (!strcmp(a, "--max-num-batched-tokens") && v) max_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--gpu-memory-utilization") && v) util = atof(argv[++i]);
        else if (!strcmp(a, "--context") && v) ctx = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && v) steps = atoi(argv[++i]);
        else if (a[0] != '-' && !model_path) model_path = a;
        else {
            fprintf(stderr, "usage: %s MODEL [--dummy] [--kv-cache-dtype bf16|fp8] [--max-model-len N] "
                    "[--max-num-seqs N] [--max-num-batched-tokens N] [--gpu-memory-utilization F] [--context N] "
                    "[--steps N] [--enforce-eager] [--quantization q8_0] [--profile]\n", argv[0]);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "%s: MODEL missing\n", argv[0]);
        return 2;
    }
    const char *lib = getenv("TESSERA_CUDA_LIB") ? getenv("TESSERA_CUDA_LIB") : "build/libtessera-cuda.so";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    void *c = h ? dlsym(h, "tessera_cuda_backend_create") : NULL, *t = h ? dlsym(h, "tessera_cuda_backend_timing") : NULL,
         *lv = h ? dlsym(h, "tessera_cuda_set_log_level") : NULL,
         *pr = h ? dlsym(h, "tessera_cuda_profile_forward") : NULL;
    if (!c || !t || !lv || !pr) {
        fprintf(stderr, "%s: cannot use %s: %s\n", argv[0], lib, h ? "missing entry points" : dlerror());
        return 1;
    }
    memcpy(&g_create, &c, sizeof c);
    memcpy(&g_timing, &t, sizeof t);
    memcpy(&g_profile, &pr, sizeof pr);
    void (*set_level)(int);
    memcpy(&set_level, &lv, sizeof lv);
    set_level(2);

    char err[ERR_BUF];
    struct model *m = NULL;
    double t0 = now_ms();
    const unsigned flags = MODEL_LOAD_NO_TOKENIZER | (dummy ? MODEL_LOAD_DUMMY : 0) | (q8_0 ? MODEL_LOAD_Q8_0 : 0);
    if (model_load(model_path, flags, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t_load = now_ms() - t0;
    struct backend_config cfg = { 0 };
    cfg.device = BACKEND_DEVICE_CUDA;
    cfg.max_num_seqs = max_seqs;
    cfg.max_num_batched_tokens = max_tokens;
    cfg.max_model_len = max_model_len;
    cfg.block_size = 16;
    cfg.kv_dtype_auto = !strcmp(kv, "auto");
    if (!cfg.kv_dtype_auto && kv_dtype_parse(kv, &cfg.kv_dtype)) {
        fprintf(stderr, "--kv-cache-dtype %s?\n", kv);
        return 2;
    }
    cfg.gpu_memory_utilization = util;
    cfg.enforce_eager = eager;
    struct bench b = { 0 };
    b.vocab = m->cfg.vocab_size;
    b.bs = 16;
    b.max_blocks = (max_model_len + 15) / 16;
    t0 = now_ms();
    if (g_create(m, &cfg, &b.ops, &b.impl, &b.info, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t_create = now_ms() - t0;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    b.greedy = sampler_create(&sp, b.vocab);

    char desc[MODEL_DESC_MAX];
    model_describe(m, desc, sizeof desc);
    printf("model: %s\n", desc);
    printf("backend: %s; weights %.2f GiB, activations %.2f GiB, KV %.2f GiB (%s, %d blocks, %d x %d-token "
           "sequences); graphs %s; load %.1f s, create %.1f s\n",
           b.info.device, b.info.weight_bytes / 1073741824.0, b.info.activation_bytes / 1073741824.0,
           b.info.kv_bytes / 1073741824.0, kv_dtype_name(b.info.kv_dtype), b.info.num_blocks, b.info.max_concurrency,
           max_model_len, b.info.graphs ? "on" : "off", t_load / 1e3, t_create / 1e3);

    printf("\n%-34s %12s %14s %s\n", "row", "value", "target", "");
    /* a batch runs when max_num_seqs and the KV cache hold it; the prefill when the context does */
    const long blocks_per_seq = (ctx + steps + 16) / 16 + 1;
#define FITS(n) (max_seqs >= (n) && (long)b.info.num_blocks >= (n) * blocks_per_seq && ctx + steps < max_model_len)
    double idle1 = 0, idle8 = 0, idle64 = 0, idle256 = 0, d1 = -1, d8 = -1, d64 = -1, d256 = -1, pf = -1;
    int fails = 0;
    err[0] = 0;
    /* with --profile, each decode batch's last step again kernel by kernel */
    static struct profile prof[4] = { { -1, 0, { { "", 0, 0 } } }, { -1, 0, { { "", 0, 0 } } },
                                      { -1, 0, { { "", 0, 0 } } }, { -1, 0, { { "", 0, 0 } } } };
    if (FITS(1)) d1 = run_decode(&b, 1, ctx, steps, max_tokens, &idle1, err, sizeof err);
    if (!err[0] && d1 >= 0 && profile) run_profile(&b, &prof[0], err, sizeof err);
    if (!err[0] && FITS(8)) d8 = run_decode(&b, 8, ctx, steps, max_tokens, &idle8, err, sizeof err);
    if (!err[0] && d8 >= 0 && profile) run_profile(&b, &prof[1], err, sizeof err);
    if (!err[0] && FITS(64)) d64 = run_decode(&b, 64, ctx, steps, max_tokens, &idle64, err, sizeof err);
    if (!err[0] && d64 >= 0 && profile) run_profile(&b, &prof[2], err, sizeof err);
    if (!err[0] && FITS(256)) d256 = run_decode(&b, 256, ctx, steps, max_tokens, &idle256, err, sizeof err);
    if (!err[0] && d256 >= 0 && profile) run_profile(&b, &prof[3], err, sizeof err);
    if (!err[0] && max_model_len >= 1024 && max_tokens >= 1024) pf = run_prefill(&b, 1024, err, sizeof err);
    /* a mixed step: up to 64 decode rows (as many as max_num_seqs leaves beside the prompt) and a
       1,024-token prompt */
    const int mixed_n = max_seqs - 1 < 64 ? max_seqs - 1 : 64;
    double mx = -1;
    if (!err[0] && mixed_n >= 1 && FITS(mixed_n + 1) && max_model_len > 1024 && max_tokens >= mixed_n + 1024)
        mx = run_mixed(&b, mixed_n, ctx, 1024, max_tokens, err, sizeof err);
#undef FITS
    if (err[0]) {
        fprintf(stderr, "error: %s\n", err);
        fails++;
    }
    double wbytes = (double)m->w.matrix_bytes;
    /* a row that could not run here (too small a configuration) says so and does not count */
#define ROW(name, val, unit, target, ok)                                                                  \
    do {                                                                                                    \
        if ((val) < 0) {                                                                                    \
            printf("%-34s %13s %14s (not run: configuration too small)\n", name, "-", target);              \
        } else {                                                                                            \
            printf("%-34s %9.3f %-3s %14s %s\n", name, val, unit, target, (ok) ? "PASS" : "MISS");         \
            fails += !(ok);                                                                                 \
        }                                                                                                   \
    } while (0)
    ROW("decode step, batch 1", d1, "ms", "<= 4.4 ms", d1 <= 4.4);
    ROW("decode step, batch 8 / batch 1", d1 > 0 && d8 >= 0 ? d8 / d1 : -1, "x", "<= 1.10", d8 / d1 <= 1.10);
    ROW("GPU idle between steps, batch 1", d1 >= 0 ? 100 * idle1 : -1, "%", "< 5 %", idle1 < 0.05);
    ROW("decode step, batch 8", d8, "ms", "", true);
    if (d64 >= 0) {
        ROW("decode step, batch 64", d64, "ms", "", true);
        printf("%-34s %9.0f %-3s %14s\n", "  tokens/s at batch 64", 64e3 / d64, "", "");
    }
    if (d256 >= 0) {
        ROW("decode step, batch 256", d256, "ms", "", true);
        printf("%-34s %9.0f %-3s %14s\n", "  tokens/s at batch 256", 256e3 / d256, "", "");
    }
    ROW("prefill 1024 tokens + sample (TTFT)", pf, "ms", "<= 30 ms", pf <= 30);
    char mixed_name[64];
    snprintf(mixed_name, sizeof mixed_name, "mixed step, %d decode + 1024 prompt", mixed_n);
    ROW(mixed_name, mx, "ms", "", true);
    if (mx >= 0 && pf >= 0)
        printf("%-34s %9.3f %-3s %14s\n", "  => the decode rows' share", mx - pf, "ms", "(mixed - TTFT)");
    printf("%-34s %9.2f %-3s %14s\n", "weights read per decode step", wbytes / 1e9, "GB", "");
    printf("%-34s %9.0f %-3s %14s\n", "  => at batch 1", d1 > 0 ? wbytes / (d1 * 1e-3) / 1e9 : 0, "GB/s",
           "(H200 ~4300 copy)");
    print_profile("batch 1", &prof[0], d1);
    print_profile("batch 8", &prof[1], d8);
    print_profile("batch 64", &prof[2], d64);
    print_profile("batch 256", &prof[3], d256);
    sampler_free(b.greedy);
    b.ops->destroy(b.impl);
    model_free(m);
    return fails ? 1 : 0;
}
