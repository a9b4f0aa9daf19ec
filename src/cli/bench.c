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
 * --json-schema FILE adds structured output: the scheduler runs --batch sequences (seeded
 * sampling, each its own seed) with and without that schema as a grammar, side by side,
 * and reports the time of a full-batch decode step in both, their ratio, and the time the
 * scheduler spent filling the token masks per step (sched_stats.mask_ns). Each constrained
 * pass compiles the schema anew, so the grammar's mask cache starts cold as it does for
 * a new request.
 */
#define _GNU_SOURCE
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
    int threads = 0, n_prompt = 128, n_gen = 64, reps = 3;
    enum kv_dtype kv = KV_F16;
    struct backend_config bc;
    backend_config_default(&bc);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--model") && (v = args_value(argc, argv, &i))) model_path = v;
        else if (!strcmp(f, "--threads") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 1024, &threads)) return 2; }
        else if (!strcmp(f, "--prompt-tokens") && (v = args_value(argc, argv, &i))) { if (args_int(f, v, 1, 1 << 16, &n_prompt)) return 2; }
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
        } else if (!strcmp(f, "--gpu-memory-utilization") && (v = args_value(argc, argv, &i))) {
            float x;
            if (args_float(f, v, 0, 1, &x) || !(x > 0)) return 2;
            bc.gpu_memory_utilization = x;
        } else {
            fprintf(stderr,
                    "usage: tessera bench --model PATH [--threads N] [--prompt-tokens N] [--gen-tokens N]\n"
                    "                     [--reps N] [--kv-dtype f32|f16|bf16|fp8] [--device auto|cpu|cuda]\n"
                    "                     [--enforce-eager] [--gpu-memory-utilization X (CUDA; ignored by the CPU)]\n"
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
    if ((rc = model_load(model_path, 0, &m, err, sizeof err))) goto fail;
    if (schema_path) {
        bc.n_threads = threads;
        bc.kv_dtype_auto = false;
        bc.kv_dtype = kv;
        if ((rc = bench_grammar(m, &bc, schema_path, batch, n_gen, reps, err, sizeof err))) goto fail;
        status = 0;
        goto done;
    }
    struct threadpool *tp = tp_create(threads);
    if (!tp) { rc = err_set(err, sizeof err, ERR_NOMEM, "thread pool"); goto fail; }
    double bw = membw_read(tp, 0, 5);
    tp_free(tp);

    int ctx = n_prompt + n_gen + 1;
    bc.n_threads = threads;
    bc.kv_dtype_auto = false;
    bc.kv_dtype = kv;
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0;
    ids = malloc(sizeof *ids * (size_t)n_prompt);
    smp = sampler_create(&sp, m->cfg.vocab_size);
    if (!ids || !smp) { rc = err_set(err, sizeof err, ERR_NOMEM, "out of memory"); goto fail; }
    /* a fixed pseudo-random prompt: the speed does not depend on the ids */
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)((1103515245u * (unsigned)i + 12345u) % (unsigned)m->cfg.vocab_size);

    double best_prefill = 1e30, best_decode = 1e30;
    for (int r = 0; r < reps; r++) {
        runner_free(&run); /* a fresh cache per repetition */
        if ((rc = runner_create(&run, m, &bc, ctx, n_prompt, err, sizeof err))) goto fail;
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
