/* tool_bench_ttft.c — time to first token through the engine (engine.h): a shared
 * ~1,000-token system prompt followed by a short distinct user suffix, cold (no prefix
 * cache hit) versus prefix-cache hit, side by side in one run.
 *
 *   build/tests/tool_bench_ttft [--model M] [--threads T] [--reps R] [--system-tokens N]
 *                               [--kv-mib MIB] [--user-suffix 0|1]
 *
 * Cold and hit requests alternate in the same engine, one at a time, max_tokens 1. A cold
 * request carries a cache salt never used before, so none of its blocks can match (the
 * same as an empty cache for that request, without rebuilding the engine); a hit request
 * has no salt and finds the system prompt cached by a warm-up request. With --user-suffix 0
 * every request is the system prompt alone, repeated exactly (a full hit when N is a
 * multiple of the 16-token block: only the last token is forwarded). Reports the median,
 * min and max of req_output.t_first_token (submit → first token, queueing included) and
 * the cached-token counts, then the KV capacity of a memory budget for each KV dtype
 * (bytes per token from the KV layout, kv_cache_block_bytes).
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/engine.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const system_para =
    "You are a careful assistant for a public library. Answer questions about opening hours, "
    "memberships, borrowing rules, fines, events, study rooms, printing and the catalogue. "
    "Members may borrow up to twelve items at once; books are lent for three weeks, films "
    "for one week, and each loan may be renewed twice unless another member has reserved "
    "the item. Study rooms are booked at the front desk for up to two hours per day. ";

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs one request to its end; returns its TTFT in seconds (or -1) and its cached count. */
static double run_one(struct engine *e, const int32_t *ids, int n, const char *salt,
                      int *n_cached)
{
    char err[ERR_BUF];
    struct req_params p;
    req_params_default(&p);
    p.sp.temperature = 0;
    p.max_tokens = 1;
    p.cache_salt = salt;
    struct request *r = NULL;
    *n_cached = 0;
    if (engine_submit(e, ids, n, &p, NULL, NULL, &r, err, sizeof err)) {
        fprintf(stderr, "submit: %s\n", err);
        return -1;
    }
    struct req_output o = { 0 };
    while (o.finish == REQ_FINISH_NONE && request_wait(r, 120)) request_take(r, &o);
    double t = o.t_first_token;
    *n_cached = o.n_cached;
    req_output_free(&o);
    request_release(r);
    return t;
}

int main(int argc, char **argv)
{
    const char *model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    int threads = 2, reps = 7, sys_tokens = 1000, kv_mib = 1024, suffix = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_path = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--system-tokens")) sys_tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-mib")) kv_mib = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--user-suffix")) suffix = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 100 || sys_tokens < 16 || sys_tokens > 3000 || kv_mib < 1) {
        fprintf(stderr, "--reps 1..100, --system-tokens 16..3000, --kv-mib >= 1\n");
        return 2;
    }
    char err[ERR_BUF];
    struct model *m = NULL;
    if (model_load(model_path, 0, &m, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* the system prompt: the paragraph repeated, cut at sys_tokens */
    size_t plen = strlen(system_para), tlen = plen * (size_t)(sys_tokens / 40 + 2);
    char *text = malloc(tlen + 1);
    int32_t *ids = malloc(sizeof *ids * (size_t)(sys_tokens + 64));
    int32_t *all = NULL;
    if (!text || !ids) return 1;
    for (size_t off = 0; off < tlen; off += plen) memcpy(text + off, system_para, plen);
    text[tlen] = 0;
    int n_all = tok_encode(m->tok, text, tlen, false, false, NULL, 0);
    if (n_all < sys_tokens || !(all = malloc(sizeof *all * (size_t)n_all))) return 1;
    tok_encode(m->tok, text, tlen, false, false, all, n_all);
    memcpy(ids, all, sizeof *ids * (size_t)sys_tokens);

    int max_len = 2048;
    while (max_len < sys_tokens + 128) max_len *= 2;
    struct engine_config cfg = { 0 };
    sched_config_default(&cfg.sched);
    cfg.sched.max_num_seqs = 8;
    cfg.sched.max_num_batched_tokens = max_len;
    cfg.sched.max_model_len = max_len;
    cfg.sched.backend.device = BACKEND_DEVICE_CPU;
    cfg.sched.backend.num_blocks = 2 * max_len / KV_DEFAULT_BLOCK_SIZE;
    cfg.sched.backend.n_threads = threads;
    cfg.sched.backend.kv_dtype_auto = false;
    cfg.sched.backend.kv_dtype = KV_F16;
    struct engine *e = NULL;
    if (engine_create(&e, m, &cfg, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double *cold = calloc((size_t)reps, sizeof *cold), *hit = calloc((size_t)reps, sizeof *hit);
    int cold_cached = 0, hit_cached = 0, n = 0, nc = 0;
    /* the user suffix: distinct per request, so only the system prompt can be shared */
    for (int i = -1; i < reps; i++) {
        for (int kind = 0; kind < 2; kind++) {
            char user[96], salt[32];
            snprintf(user, sizeof user, "\nUser %d: How many items can I borrow, and for how long? (%d)\n",
                     i + 2, kind);
            int nu = suffix ? tok_encode(m->tok, user, strlen(user), false, false, ids + sys_tokens, 64) : 0;
            n = sys_tokens + nu;
            snprintf(salt, sizeof salt, "cold-%d", i + 1);
            double t = run_one(e, ids, n, kind == 0 ? salt : NULL, &nc);
            if (i < 0) continue; /* warm-up: caches the system prompt, warms the threads */
            if (kind == 0) cold[i] = t, cold_cached += nc;
            else hit[i] = t, hit_cached += nc;
        }
    }
    qsort(cold, (size_t)reps, sizeof *cold, cmp_double);
    qsort(hit, (size_t)reps, sizeof *hit, cmp_double);
    printf("TTFT, %s, %d threads, %d-token shared prompt + %d-token user suffix, "
           "%d reps (median [min, max]):\n\n", m->name, threads, sys_tokens, n - sys_tokens, reps);
    printf("| case | cached tokens (mean) | TTFT median | min | max |\n| --- | --- | --- | --- | --- |\n");
    printf("| cold (fresh salt) | %d | %.1f ms | %.1f | %.1f |\n", cold_cached / reps,
           1e3 * cold[reps / 2], 1e3 * cold[0], 1e3 * cold[reps - 1]);
    printf("| prefix-cache hit | %d | %.1f ms | %.1f | %.1f |\n", hit_cached / reps,
           1e3 * hit[reps / 2], 1e3 * hit[0], 1e3 * hit[reps - 1]);
    printf("\nspeedup (cold / hit, medians): %.1fx\n", hit[reps / 2] > 0 ? cold[reps / 2] / hit[reps / 2] : 0.0);

    printf("\nKV capacity of %d MiB (%d layers x %d KV heads x %d head_dim x 2):\n\n", kv_mib,
           m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim);
    printf("| kv dtype | bytes / token | tokens in %d MiB |\n| --- | --- | --- |\n", kv_mib);
    const struct { enum kv_dtype d; const char *name; } dts[] = { { KV_F32, "f32" },
                                                                  { KV_F16, "f16" },
                                                                  { KV_FP8_E4M3, "fp8" } };
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        size_t bb = kv_cache_block_bytes(&m->cfg, KV_DEFAULT_BLOCK_SIZE, dts[i].d);
        size_t blocks = ((size_t)kv_mib << 20) / bb;
        printf("| %s | %zu | %zu |\n", dts[i].name, bb / KV_DEFAULT_BLOCK_SIZE,
               blocks * KV_DEFAULT_BLOCK_SIZE);
    }
    engine_free(e);
    free(cold);
    free(hit);
    free(all);
    free(ids);
    free(text);
    model_free(m);
    return 0;
}
