/* bench.c — `tessera bench`: prefill and decode speed of one sequence, printed beside
 * the memory-bandwidth roofline measured in the same run.
 *
 * Roofline: a decode step is memory-bound — it reads every weight matrix once (plus one
 * embedding row and the KV cache so far). bytes_per_token / measured read bandwidth is
 * the fastest a step can be; the ratio achieved/roofline is the figure of merit. The
 * bandwidth is measured with the same thread count right before the runs. Every step
 * goes through the backend interface (backend.h) with greedy sampling of its last row,
 * as a decode step of the engine does; --device picks the backend (the roofline is the
 * host's memory bandwidth, meaningful for the CPU backend).
 *
 * Prefill is compute-bound, so each prompt length of --prompt-tokens (default 128, 512,
 * 2048) is also printed as a FLOP rate beside this machine's compute peak, measured in
 * the same run on as many threads (backend/cpu/peak.h: a register-only loop of the
 * instruction the default matmul kernels use for the model's main weight type). FLOPs of
 * a prefill of T tokens (prefill_flops):
 *   2 x P x T               P = parameters of the layers' matrices (q, k, v, o, gate,
 *                           up, down), each touched once per token
 * + 2 x vocab x dim         the output head, for the last row only (the prefill samples
 *                           the next token from it; no other row's logits are computed)
 * + 4 x L x H x D x T(T+1)/2  causal attention, QK^T and PV: query t meets keys 0..t
 * with L layers, H query heads of D elements. Norms, RoPE, softmax and activations are
 * left out (under 1% here). The first length's prefill is also the prompt of the decode
 * run, whose lines are unchanged.
 *
 * --json-schema FILE adds structured output: the scheduler runs --batch sequences (seeded
 * sampling, each its own seed) with and without that schema as a grammar, side by side,
 * and reports the time of a full-batch decode step in both, their ratio, and the time the
 * scheduler spent filling the token masks per step (sched_stats.mask_ns). Each constrained
 * pass compiles the schema anew, so the grammar's mask cache starts cold as it does for
 * a new request.
 */
#define _GNU_SOURCE
#include "backend/cpu/peak.h"
#include "backend/cpu/quant_kernels.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/runner.h"
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/mapfile.h"
#include "util/membw.h"
#include "util/threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes a decode step at context length ctx reads: every matrix, one embedding row,
 * the K and V of ctx positions in every layer. */
static double decode_bytes(const struct model *m, int ctx, enum kv_dtype kv)
{
    const struct model_weights *w = &m->w;
    double b = 0;
    for (int l = 0; l < w->n_layers; l++) {
        const struct layer_weights *L = &w->layers[l];
        b += (double)(L->wq->nbytes + L->wk->nbytes + L->wv->nbytes + L->wo->nbytes +
                      L->w_gate->nbytes + L->w_up->nbytes + L->w_down->nbytes);
    }
    b += (double)w->output->nbytes;
    b += (double)w->token_embd->nbytes / (double)m->cfg.vocab_size;
    b += 2.0 * m->cfg.n_layers * m->cfg.n_kv_heads * m->cfg.head_dim * (double)ctx * (double)kv_dtype_size(kv);
    return b;
}

/* Parameters of the layers' matrices: what one prompt token multiplies by. */
static int64_t layer_matrix_params(const struct model *m)
{
    int64_t p = 0;
    for (int l = 0; l < m->w.n_layers; l++) {
        const struct layer_weights *L = &m->w.layers[l];
        const struct tensor *t[7] = { L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down };
        for (int k = 0; k < 7; k++) p += t[k]->ne[0] * t[k]->ne[1];
    }
    return p;
}

/* FLOPs of a prefill of n tokens (formula in the header comment). */
static int64_t prefill_flops(const struct model *m, int n)
{
    const struct model_config *c = &m->cfg;
    int64_t t = n;
    int64_t f = 2 * layer_matrix_params(m) * t;
    f += 2 * m->w.output->ne[0] * m->w.output->ne[1];
    f += 4 * (int64_t)c->n_layers * c->n_heads * c->head_dim * (t * (t + 1) / 2);
    return f;
}

/* The weight type holding most of the layers' matrix parameters: its kernels do most of
 * a prefill's work, so its instruction's peak is the one to compare with. */
static enum dtype main_weight_type(const struct model *m)
{
    int64_t by_type[DT_COUNT_] = { 0 };
    for (int l = 0; l < m->w.n_layers; l++) {
        const struct layer_weights *L = &m->w.layers[l];
        const struct tensor *t[7] = { L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down };
        for (int k = 0; k < 7; k++)
            if ((unsigned)t[k]->type < DT_COUNT_) by_type[t[k]->type] += t[k]->ne[0] * t[k]->ne[1];
    }
    enum dtype best = DT_F32;
    for (int d = 0; d < DT_COUNT_; d++)
        if (by_type[d] > by_type[best]) best = (enum dtype)d;
    return best;
}

#define BENCH_MAX_PROMPTS 16

/* Parses "128,512,2048" (each 1..65536, at most BENCH_MAX_PROMPTS). 0 or -1 (message on
 * stderr, as args_int). */
static int parse_prompt_list(const char *flag, const char *s, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    for (;;) {
        char item[16];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *n == BENCH_MAX_PROMPTS) {
            fprintf(stderr, "%s: '%s' is not a list of up to %d integers in [1, 65536] (e.g. 128,512,2048)\n", flag,
                    s, BENCH_MAX_PROMPTS);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (args_int(flag, item, 1, 1 << 16, &out[(*n)++])) return -1;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* *peak = the larger of *peak and the compute peak of kind pk on `threads` threads (best
 * of 5 runs of 50 ms). */
static int measure_peak(int threads, enum cpu_peak_kind pk, double *peak, char *err, size_t errlen)
{
    struct threadpool *tp = tp_create(threads);
    if (!tp) return err_set(err, errlen, ERR_NOMEM, "thread pool");
    double g = 0;
    int rc = cpu_peak_measure(tp, pk, 0.05, 5, &g, err, errlen);
    tp_free(tp);
    if (!rc && g > *peak) *peak = g;
    return rc;
}

/* Seconds of the fastest prefill of ids[0, n) into an empty cache: up to reps runs, fewer
 * once this length has taken 3 s (long prompts are slow and steadier). The runs share one
 * backend, restarted between them, as a server's requests do: the first run also pays for
 * first-touch page faults in the fresh buffers (thousands at 512 tokens), the best one does
 * not. */
static int time_prefill(const struct model *m, const struct backend_config *bc, const int32_t *ids, int n,
                        struct sampler *smp, int reps, double *best, char *err, size_t errlen)
{
    struct runner run = { 0 };
    double spent = 0;
    *best = 1e30;
    int rc = runner_create(&run, m, bc, n + 1, n, err, errlen);
    for (int r = 0; !rc && r < reps && (r == 0 || spent < 3.0); r++) {
        runner_restart(&run);
        int32_t next;
        double t0 = now_s();
        if ((rc = runner_feed(&run, ids, n, smp, &next, err, errlen))) break;
        double dt = now_s() - t0;
        spent += dt;
        if (dt < *best) *best = dt;
    }
    runner_free(&run);
    return rc;
}

/* One pass of the structured-output comparison: batch sequences of prompt ids[0, n),
 * constrained by g (NULL: none). Adds up the time and the mask time of the steps in which
 * every one of the batch sequences ran one decode row. */
struct gpass {
    double step_s, mask_s;   /* summed over the measured steps */
    int steps;               /* measured */
    int stopped;             /* sequences that ended with the grammar */
};

static int grammar_pass(const struct model *m, const struct backend_config *bc, const int32_t *ids, int n,
                        int batch, int n_gen, struct grammar *g, struct gpass *out, char *err, size_t errlen)
{
    struct sched_config cfg;
    sched_config_default(&cfg);
    cfg.max_num_seqs = batch;
    cfg.max_num_batched_tokens = n * batch > 256 ? n * batch : 256;
    cfg.max_model_len = n + n_gen + 1;
    cfg.enable_prefix_caching = false;
    cfg.overlap = SCHED_OVERLAP_OFF; /* time each step alone */
    cfg.backend = *bc;
    struct sched *s = NULL;
    int rc = sched_create(&s, m, &cfg, err, errlen);
    if (rc) return rc;
    *out = (struct gpass){ 0 };
    for (int i = 0; i < batch; i++) {
        struct sched_seq_params p;
        sched_seq_params_default(&p);
        p.sp.temperature = 0.8f;
        p.sp.seed = 42 + (uint64_t)i; /* distinct rows: no two masks the same by construction */
        p.max_tokens = n_gen;
        p.ignore_eos = g == NULL; /* unconstrained rows run the whole length */
        p.grammar = g;
        int64_t id;
        if ((rc = sched_add(s, ids, n, &p, &id, err, errlen))) goto done;
    }
    struct sched_stats a, b;
    while (sched_has_work(s)) {
        sched_get_stats(s, &a);
        double t0 = now_s();
        if ((rc = sched_step(s, NULL, NULL, err, errlen))) goto done;
        double dt = now_s() - t0;
        sched_get_stats(s, &b);
        /* a full decode step: every sequence running, one row each, none finished in it */
        if (a.num_running == batch && b.num_running == batch && b.batched_tokens - a.batched_tokens == (uint64_t)batch) {
            out->step_s += dt;
            out->mask_s += (double)(b.mask_ns - a.mask_ns) * 1e-9;
            out->steps++;
        }
    }
done:
    sched_free(s);
    return rc;
}

/* --json-schema: the decode step with and without the grammar, best of reps each. */
static int bench_grammar(const struct model *m, const struct backend_config *bc, const char *schema_path, int batch,
                         int n_gen, int reps, char *err, size_t errlen)
{
    char *schema = NULL;
    size_t schema_len = 0;
    struct grammar_vocab *gv = NULL;
    struct grammar *g = NULL;
    int32_t *ids = NULL;
    char *prompt = NULL;
    int rc = read_text_file(schema_path, &schema, &schema_len, err, errlen);
    if (rc) return rc;
    if ((rc = grammar_vocab_create(&gv, m->tok, m->eog_ids, m->n_eog, err, errlen))) goto done;
    struct grammar_spec spec = { .kind = GRAMMAR_JSON_SCHEMA, .text = schema, .text_len = schema_len };
    double t_compile = 1e30;
    /* a prompt that asks for the schema, so the constrained text is what a client gets */
    size_t cap = schema_len + 128;
    prompt = malloc(cap);
    ids = malloc(sizeof *ids * cap);
    if (!prompt || !ids) { rc = err_set(err, errlen, ERR_NOMEM, "out of memory"); goto done; }
    int len = snprintf(prompt, cap, "An example JSON value for the JSON schema %.*s:\n", (int)schema_len, schema);
    int n = tok_encode(m->tok, prompt, (size_t)len, true, false, ids, (int)cap);
    if (n <= 0 || n > (int)cap) { rc = err_set(err, errlen, ERR_INVALID, "cannot tokenize the prompt"); goto done; }
    struct gpass best[2] = { { .step_s = 1e30, .steps = 1 }, { .step_s = 1e30, .steps = 1 } };
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) { /* interleaved: both see the same machine */
            struct gpass p;
            if (k) { /* a fresh grammar: its mask cache starts cold, as for a new request */
                grammar_unref(g);
                g = NULL;
                double t0 = now_s();
                if ((rc = grammar_compile(&g, gv, &spec, err, errlen))) goto done;
                if (now_s() - t0 < t_compile) t_compile = now_s() - t0;
            }
            if ((rc = grammar_pass(m, bc, ids, n, batch, n_gen, k ? g : NULL, &p, err, errlen))) goto done;
            if (p.steps == 0) {
                rc = err_set(err, errlen, ERR_RANGE, "no full-batch decode step measured: raise --gen-tokens or use a "
                             "schema with longer output");
                goto done;
            }
            if (p.step_s / p.steps < best[k].step_s / best[k].steps) best[k] = p;
        }
    }
    double plain = best[0].step_s / best[0].steps, masked = best[1].step_s / best[1].steps;
    double mask = best[1].mask_s / best[1].steps;
    printf("structured output: %s, batch %d, prompt %d tokens, up to %d generated (best of %d; each "
           "constrained pass compiles the schema afresh: cold mask cache)\n", schema_path, batch, n, n_gen, reps);
    printf("| metric | value |\n| --- | --- |\n");
    printf("| grammar compile | %.2f ms |\n", t_compile * 1e3);
    printf("| decode step, unconstrained | %.2f ms (%d steps) |\n", plain * 1e3, best[0].steps);
    printf("| decode step, with the schema | %.2f ms (%d steps) |\n", masked * 1e3, best[1].steps);
    printf("| constrained / unconstrained | %.3f |\n", masked / plain);
    printf("| mask fill per step (%d rows) | %.3f ms = %.1f%% of an unconstrained step |\n", batch, mask * 1e3,
           100.0 * mask / plain);
done:
    free(ids);
    free(prompt);
    grammar_unref(g);
    if (gv) grammar_vocab_free(gv);
    free(schema);
    return rc;
}

int cli_bench(int argc, char **argv)
{
    const char *model_path = NULL, *schema_path = NULL;
    int batch = 8;
    int threads = 0, n_gen = 64, reps = 3, max_model_len = 0;
    int prompts[BENCH_MAX_PROMPTS] = { 128, 512, 2048 }, n_prompts = 3;
    enum kv_dtype kv = KV_F16;
    unsigned load_flags = 0; /* --quantization, --dtype */
    struct backend_config bc;
    backend_config_default(&bc);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--model") && (v = args_value(argc, argv, &i))) model_path = v;
        else if (!strcmp(f, "--threads") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 1024, &threads)) return 2; }
        else if (!strcmp(f, "--prompt-tokens") && (v = args_value(argc, argv, &i))) { if (parse_prompt_list(f, v, prompts, &n_prompts)) return 2; }
        else if (!strcmp(f, "--max-model-len") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 2, 1 << 24, &max_model_len)) return 2; }
        else if (!strcmp(f, "--gen-tokens") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 1 << 16, &n_gen)) return 2; }
        else if (!strcmp(f, "--reps") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 100, &reps)) return 2; }
        else if (!strcmp(f, "--json-schema") && (v = args_value(argc, argv, &i))) schema_path = v;
        else if (!strcmp(f, "--batch") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 1024, &batch)) return 2; }
        else if (!strcmp(f, "--kv-dtype") && (v = args_value(argc, argv, &i))) {
            if (kv_dtype_parse(v, &kv)) { fprintf(stderr, "--kv-dtype: f32, f16 (fp16), bf16 or fp8\n"); return 2; }
        } else if (!strcmp(f, "--device") && (v = args_value(argc, argv, &i))) {
            if (backend_device_parse(v, &bc.device)) { fprintf(stderr, "--device: auto, cpu or cuda\n"); return 2; }
        } else if (!strcmp(f, "--enforce-eager")) {
            bc.enforce_eager = true;
        } else if ((!strcmp(f, "--quantization") || !strcmp(f, "-q")) && (v = args_value(argc, argv, &i))) {
            if (args_quantization(f, v, &load_flags)) return 2;
        } else if (!strcmp(f, "--dtype") && (v = args_value(argc, argv, &i))) {
            if (args_dtype(f, v, &load_flags)) return 2;
        } else if ((!strcmp(f, "--tensor-parallel-size") || !strcmp(f, "-tp")) && (v = args_value(argc, argv, &i))) {
            if (args_int(f, v, 1, 8, &bc.tensor_parallel_size)) return 2;
        } else if (!strcmp(f, "--gpu-memory-utilization") && (v = args_value(argc, argv, &i))) {
            float x;
            if (args_float(f, v, 0, 1, &x) || !(x > 0)) return 2;
            bc.gpu_memory_utilization = x;
        } else {
            fprintf(stderr,
                    "usage: tessera bench --model PATH [--threads N] [--prompt-tokens N[,N...] (128,512,2048)]\n"
                    "                     [--gen-tokens N] [--reps N] [--max-model-len N (the model's context)]\n"
                    "                     [--kv-dtype f32|f16|bf16|fp8] [--device auto|cpu|cuda]\n"
                    "                     [--enforce-eager] [--gpu-memory-utilization X (CUDA; ignored by the CPU)]\n"
                    "                     [--tensor-parallel-size N (CUDA: N GPUs)] [--quantization none|q8_0]\n"
                    "                     [--dtype auto|bfloat16|float16|half]\n"
                    "                     [--json-schema FILE [--batch N (8)]]: decode steps with vs without the\n"
                    "                     schema as structured output, at batch N\n");
            return 2;
        }
    }
    if (!model_path) { fprintf(stderr, "bench: --model is required\n"); return 2; }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);

    char err[ERR_BUF];
    struct model *m = NULL;
    struct runner run = { 0 };
    struct sampler *smp = NULL;
    int32_t *ids = NULL;
    int rc, status = 1;
    if ((rc = model_load(model_path, load_flags, &m, err, sizeof err))) goto fail;
    if (schema_path) {
        bc.n_threads = threads;
        bc.kv_dtype_auto = false;
        bc.kv_dtype = kv;
        if ((rc = bench_grammar(m, &bc, schema_path, batch, n_gen, reps, err, sizeof err))) goto fail;
        status = 0;
        goto done;
    }
    /* prompt lengths: clamped to the context, duplicates dropped, the first one also the
     * decode run's prompt (which leaves room for --gen-tokens) */
    if (max_model_len <= 0) max_model_len = m->cfg.max_seq_len;
    int n_lens = 0;
    for (int i = 0; i < n_prompts; i++) {
        int len = prompts[i] < max_model_len ? prompts[i] : max_model_len, dup = 0;
        for (int k = 0; k < n_lens; k++) dup |= prompts[k] == len;
        if (!dup) prompts[n_lens++] = len;
    }
    int n_prompt = prompts[0], max_prompt = 0;
    for (int k = 0; k < n_lens; k++) max_prompt = prompts[k] > max_prompt ? prompts[k] : max_prompt;
    if (n_prompt + n_gen + 1 > max_model_len) n_prompt = max_model_len - n_gen - 1;
    if (n_prompt < 1) {
        rc = err_set(err, sizeof err, ERR_RANGE, "--gen-tokens %d leaves no room for a prompt in a context of %d", n_gen,
                     max_model_len);
        goto fail;
    }
    if (max_prompt < n_prompt) max_prompt = n_prompt;

    struct threadpool *tp = tp_create(threads);
    if (!tp) { rc = err_set(err, sizeof err, ERR_NOMEM, "thread pool"); goto fail; }
    double bw = membw_read(tp, 0, 5);
    tp_free(tp);
    /* the compute peak on the same number of threads, for the prefill lines: measured
     * before and again after the prefill runs, the best taken, so that a moment of a
     * slower machine (a busy neighbour on a shared host) cannot inflate the ratio */
    enum dtype wtype = main_weight_type(m);
    enum cpu_peak_kind pk = cpu_peak_kind_for(NULL, wtype);
    double peak = 0;
    if ((rc = measure_peak(threads, pk, &peak, err, sizeof err))) goto fail;

    int ctx = n_prompt + n_gen + 1;
    bc.n_threads = threads;
    bc.kv_dtype_auto = false;
    bc.kv_dtype = kv;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    ids = malloc(sizeof *ids * (size_t)max_prompt);
    smp = sampler_create(&sp, m->cfg.vocab_size);
    if (!ids || !smp) { rc = err_set(err, sizeof err, ERR_NOMEM, "out of memory"); goto fail; }
    /* a fixed pseudo-random prompt: the speed does not depend on the ids */
    for (int i = 0; i < max_prompt; i++) ids[i] = (int32_t)((1103515245u * (unsigned)i + 12345u) % (unsigned)m->cfg.vocab_size);

    double best_prefill = 1e30, best_decode = 1e30;
    if ((rc = runner_create(&run, m, &bc, ctx, n_prompt, err, sizeof err))) goto fail;
    for (int r = 0; r < reps; r++) {
        runner_restart(&run); /* an empty cache per repetition, the same buffers (as time_prefill) */
        int32_t next;
        double t0 = now_s();
        if ((rc = runner_feed(&run, ids, n_prompt, smp, &next, err, sizeof err))) goto fail;
        double tp_ = now_s() - t0;
        t0 = now_s();
        for (int g = 0; g < n_gen; g++) {
            /* fixed ids, not the sampled ones: the speed does not depend on them */
            int32_t tok = (int32_t)(g * 7919 % m->cfg.vocab_size);
            if ((rc = runner_feed(&run, &tok, 1, smp, &next, err, sizeof err))) goto fail;
        }
        double td = now_s() - t0;
        if (tp_ < best_prefill) best_prefill = tp_;
        if (td < best_decode) best_decode = td;
    }
    double bytes = decode_bytes(m, n_prompt + n_gen / 2, kv);
    double decode_tps = n_gen / best_decode;
    double roof_tps = bw / bytes;
    printf("model: %s  backend: %s (%s)  threads: %d  kv: %s  prompt: %d  gen: %d\n", m->name,
           backend_get_info(run.be)->name, backend_get_info(run.be)->device, threads, kv_dtype_name(kv), n_prompt,
           n_gen);
    printf("| metric | value |\n| --- | --- |\n");
    printf("| memory read bandwidth | %.2f GB/s |\n", bw / 1e9);
    printf("| bytes read per decode token | %.1f MB |\n", bytes / 1e6);
    printf("| prefill | %.1f tok/s |\n", n_prompt / best_prefill);
    printf("| decode | %.1f tok/s |\n", decode_tps);
    printf("| decode roofline | %.1f tok/s |\n", roof_tps);
    printf("| decode / roofline | %.2f |\n", decode_tps / roof_tps);
    fflush(stdout);

    /* prefill at each prompt length against the compute peak */
    double pf_s[BENCH_MAX_PROMPTS];
    for (int k = 0; k < n_lens; k++) {
        if ((rc = time_prefill(m, &bc, ids, prompts[k], smp, reps, &pf_s[k], err, sizeof err))) goto fail;
        if (prompts[k] == n_prompt && best_prefill < pf_s[k]) pf_s[k] = best_prefill; /* same work, measured twice */
    }
    if ((rc = measure_peak(threads, pk, &peak, err, sizeof err))) goto fail;
    printf("\nprefill vs compute peak: %s weights, matmul kernels %s -> peak = register-only %s loop, %d thread%s, "
           "%.1f GFLOP/s (best of 10: 5 before, 5 after the prefill runs)\n",
           dtype_name(wtype), quant_impl_best()->name, cpu_peak_kind_name(pk), threads, threads == 1 ? "" : "s", peak);
    printf("FLOPs(T) = 2 x %lld x T + 2 x %lld + 4 x %d x %d x %d x T(T+1)/2 (layer matrices, output head for the last "
           "row, causal attention)\n",
           (long long)layer_matrix_params(m), (long long)(m->w.output->ne[0] * m->w.output->ne[1]), m->cfg.n_layers,
           m->cfg.n_heads, m->cfg.head_dim);
    printf("| prompt tokens | prefill | FLOPs | GFLOP/s | of peak |\n| --- | --- | --- | --- | --- |\n");
    for (int k = 0; k < n_lens; k++) {
        int64_t fl = prefill_flops(m, prompts[k]);
        double gf = (double)fl / pf_s[k] / 1e9;
        printf("| %d | %.1f tok/s | %lld | %.1f | %.1f%% of peak (%.1f GFLOP/s, %s, %d thread%s) |\n", prompts[k],
               prompts[k] / pf_s[k], (long long)fl, gf, 100.0 * gf / peak, peak, cpu_peak_kind_name(pk), threads,
               threads == 1 ? "" : "s");
    }
    status = 0;
    goto done;
fail:
    fprintf(stderr, "bench: %s\n", err);
done:
    free(ids);
    sampler_free(smp);
    runner_free(&run);
    if (m) model_free(m);
    return status;
}
