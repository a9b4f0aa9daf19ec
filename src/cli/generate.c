/* generate.c — `tessera generate`: load a model and stream a continuation to stdout.
 *
 * The prompt is plain text (tokenized with the model's BOS rule), a conversation of one
 * optional system message and one user message wrapped with the model's chat template
 * (--chat), or raw token ids (--tokens). Tokens are decoded incrementally (never half a
 * UTF-8 character) and pass through the stop-string matcher before they are printed.
 * Statistics go to stderr. Exit 0 ok, 1 runtime error, 2 usage.
 */
#define _GNU_SOURCE
#include "chat/chat.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/generate.h"
#include "cli/runner.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "sampler/stop.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/log.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static void gen_usage(FILE *f)
{
    fprintf(f,
        "usage: tessera generate --model PATH (--prompt TEXT | --prompt-file FILE | --tokens IDS |\n"
        "                                      --prompts-file FILE) [options]\n"
        "\n"
        "  --model PATH            GGUF file or Hugging Face model directory\n"
        "  --prompt TEXT           prompt text (--prompt-file reads it from a file)\n"
        "  --tokens 1,2,3          prompt as token ids (no tokenization)\n"
        "  --prompts-file FILE     one prompt per line, all run together through the batching\n"
        "                          engine; prints one JSON line per prompt, in input order\n"
        "  --max-num-seqs N        (--prompts-file) sequences per step (default 64)\n"
        "  --max-num-batched-tokens N  (--prompts-file) tokens per step (default 512)\n"
        "  --kv-cache-memory MIB   (--prompts-file) KV cache budget (default 1024)\n"
        "  --kv-blocks N           (--prompts-file) exact number of KV blocks (overrides the budget)\n"
        "  --chat                  wrap the prompt as a user message with the model's chat template\n"
        "  --system TEXT           system message (with --chat)\n"
        "  --chat-template FILE    use this Jinja chat template instead of the model's\n"
        "  --max-tokens N          tokens to generate (default 256; clamped to the context)\n"
        "  --temperature T         0 = greedy (default: the model's generation_config, else 1)\n"
        "  --top-p P  --top-k K  --min-p M\n"
        "  --repetition-penalty R  --presence-penalty P  --frequency-penalty F\n"
        "  --seed S                RNG seed (default: random)\n"
        "  --stop STR              stop string, up to %d (repeatable); not printed\n"
        "  --ignore-eos            keep going past end-of-sequence tokens\n"
        "  --ctx N                 context length (default: min(model's, 4096))\n"
        "  --threads N             CPU threads (default: all)\n"
        "  --device auto|cpu|cuda  compute backend (default auto: the GPU when usable, else the CPU)\n"
        "  --kv-dtype f32|f16|fp16|bf16|fp8  KV cache element type (default: the backend's, f16 on\n"
        "                          the CPU; fp8 = e4m3, scale 1); --kv-cache-dtype is the same flag\n"
        "  --gpu-memory-utilization X  (--prompts-file, CUDA) fraction of GPU memory to use (default\n"
        "                          0.9); the CPU backend ignores it and uses --kv-cache-memory\n"
        "  --enforce-eager         CUDA: no CUDA graphs\n"
        "  --speculative-config JSON  (--prompts-file) speculative decoding, vLLM's form:\n"
        "                          '{\"method\": \"ngram\", \"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}'\n"
        "  --json-schema FILE      (--prompts-file) structured output: every output matches the\n"
        "                          JSON schema in FILE (as response_format json_schema)\n"
        "  --tensor-parallel-size N  CUDA: split the model over N GPUs (default 1)\n"
        "  --quantization none|q8_0  q8_0: quantize F32/F16/BF16 weight matrices to Q8_0 at load\n"
        "  --dtype auto|bfloat16|float16|half  weight matrices converted to that type at load\n"
        "  --print-ids             print the generated token ids instead of text (stop strings\n"
        "                          still end generation; the ids include the token that completed one)\n"
        "  --quiet                 no statistics on stderr\n",
        STOP_MAX_STRINGS);
}

/* Parses argv into a; returns 0, or 2 for a usage error (message printed). */
static int gen_parse(int argc, char **argv, struct gen_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_tokens = 256;
    a->max_num_seqs = 64;
    a->max_num_batched_tokens = 512;
    a->kv_cache_mib = 1024;
    a->kv_dtype = KV_F16;
    a->device = BACKEND_DEVICE_AUTO;
    a->gpu_memory_utilization = 0.9;
    sampler_params_default(&a->sp);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = NULL;
#define VAL() do { if (!(v = args_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { gen_usage(stdout); exit(0); }
        else if (!strcmp(f, "--model")) { VAL(); a->model = v; }
        else if (!strcmp(f, "--prompt")) { VAL(); a->prompt = v; }
        else if (!strcmp(f, "--prompt-file")) { VAL(); a->prompt_file = v; }
        else if (!strcmp(f, "--prompts-file")) { VAL(); a->prompts_file = v; }
        else if (!strcmp(f, "--max-num-seqs")) { VAL(); if (args_int(f, v, 1, 4096, &a->max_num_seqs)) return 2; }
        else if (!strcmp(f, "--max-num-batched-tokens")) { VAL(); if (args_int(f, v, 1, 1 << 20, &a->max_num_batched_tokens)) return 2; }
        else if (!strcmp(f, "--kv-cache-memory")) { VAL(); if (args_int(f, v, 1, 1 << 24, &a->kv_cache_mib)) return 2; }
        else if (!strcmp(f, "--kv-blocks")) { VAL(); if (args_int(f, v, 1, 1 << 30, &a->kv_blocks)) return 2; }
        else if (!strcmp(f, "--tokens")) { VAL(); a->tokens = v; }
        else if (!strcmp(f, "--system")) { VAL(); a->system = v; }
        else if (!strcmp(f, "--chat-template")) { VAL(); a->chat_template_file = v; }
        else if (!strcmp(f, "--chat")) a->chat = true;
        else if (!strcmp(f, "--print-ids")) a->print_ids = true;
        else if (!strcmp(f, "--enforce-eager")) a->enforce_eager = true;
        else if (!strcmp(f, "--speculative-config")) {
            VAL();
            char why[ERR_BUF];
            if (spec_config_parse(v, &a->spec, why, sizeof why)) { fprintf(stderr, "%s\n", why); return 2; }
        }
        else if (!strcmp(f, "--json-schema")) { VAL(); a->json_schema = v; }
        else if (!strcmp(f, "--tensor-parallel-size") || !strcmp(f, "-tp")) { VAL(); if (args_int(f, v, 1, 8, &a->tensor_parallel_size)) return 2; }
        else if (!strcmp(f, "--quantization") || !strcmp(f, "-q")) { VAL(); if (args_quantization(f, v, &a->load_flags)) return 2; }
        else if (!strcmp(f, "--dtype")) { VAL(); if (args_dtype(f, v, &a->load_flags)) return 2; }
        else if (!strcmp(f, "--device")) {
            VAL();
            if (backend_device_parse(v, &a->device)) { fprintf(stderr, "--device: '%s' is not one of auto, cpu, cuda\n", v); return 2; }
        } else if (!strcmp(f, "--gpu-memory-utilization")) {
            VAL();
            float x;
            if (args_float(f, v, 0, 1, &x)) return 2;
            if (!(x > 0)) { fprintf(stderr, "--gpu-memory-utilization: must be > 0 and <= 1\n"); return 2; }
            a->gpu_memory_utilization = x;
        }
        else if (!strcmp(f, "--ignore-eos")) a->ignore_eos = true;
        else if (!strcmp(f, "--quiet")) a->quiet = true;
        else if (!strcmp(f, "--max-tokens")) { VAL(); if (args_int(f, v, 1, 1 << 20, &a->max_tokens)) return 2; }
        else if (!strcmp(f, "--threads")) { VAL(); if (args_int(f, v, 1, 1024, &a->threads)) return 2; }
        else if (!strcmp(f, "--ctx")) { VAL(); if (args_int(f, v, 1, 1 << 24, &a->ctx)) return 2; }
        else if (!strcmp(f, "--temperature")) { VAL(); if (args_float(f, v, 0, 100, &a->sp.temperature)) return 2; a->set_temp = true; }
        else if (!strcmp(f, "--top-p")) { VAL(); if (args_float(f, v, 0, 1, &a->sp.top_p)) return 2; a->set_top_p = true; }
        else if (!strcmp(f, "--top-k")) { VAL(); if (args_int(f, v, -1, 1 << 30, &a->sp.top_k)) return 2; a->set_top_k = true; }
        else if (!strcmp(f, "--min-p")) { VAL(); if (args_float(f, v, 0, 1, &a->sp.min_p)) return 2; }
        else if (!strcmp(f, "--repetition-penalty")) { VAL(); if (args_float(f, v, 0, 100, &a->sp.repetition_penalty)) return 2; a->set_rep = true; }
        else if (!strcmp(f, "--presence-penalty")) { VAL(); if (args_float(f, v, -2, 2, &a->sp.presence_penalty)) return 2; }
        else if (!strcmp(f, "--frequency-penalty")) { VAL(); if (args_float(f, v, -2, 2, &a->sp.frequency_penalty)) return 2; }
        else if (!strcmp(f, "--seed")) { VAL(); if (args_u64(f, v, &a->sp.seed)) return 2; a->set_seed = true; }
        else if (!strcmp(f, "--stop")) {
            VAL();
            if (a->n_stops == STOP_MAX_STRINGS) { fprintf(stderr, "--stop: at most %d stop strings\n", STOP_MAX_STRINGS); return 2; }
            a->stops[a->n_stops++] = v;
        } else if (!strcmp(f, "--kv-dtype") || !strcmp(f, "--kv-cache-dtype")) {
            VAL();
            if (!strcmp(v, "auto")) a->kv_dtype_set = false;
            else if (kv_dtype_parse(v, &a->kv_dtype)) {
                fprintf(stderr, "%s: '%s' is not one of auto, f32, f16, fp16, bf16, fp8, fp8_e4m3\n", f, v);
                return 2;
            } else a->kv_dtype_set = true;
        } else {
            fprintf(stderr, "generate: unknown option '%s'\n", f);
            gen_usage(stderr);
            return 2;
        }
#undef VAL
    }
    int sources = !!a->prompt + !!a->prompt_file + !!a->tokens + !!a->prompts_file;
    /* a malformed id list is a usage error, caught before the model is loaded */
    if (a->tokens && sources == 1 && (a->n_token_ids = args_ids("--tokens", a->tokens, &a->token_ids)) < 0) {
        a->n_token_ids = 0;
        return 2;
    }
    if (!a->model || sources != 1) {
        fprintf(stderr, "generate: --model and exactly one of --prompt, --prompt-file, --tokens, --prompts-file are required\n");
        gen_usage(stderr);
        return 2;
    }
    if (a->tokens && (a->chat || a->system)) {
        fprintf(stderr, "generate: --tokens cannot be combined with --chat or --system\n");
        return 2;
    }
    if (a->system && !a->chat) {
        fprintf(stderr, "generate: --system needs --chat\n");
        return 2;
    }
    if ((a->spec.num_tokens > 0 || a->json_schema) && !a->prompts_file) {
        fprintf(stderr, "generate: --%s needs --prompts-file (the batching engine)\n",
                a->json_schema ? "json-schema" : "speculative-config");
        return 2;
    }
    char err[ERR_BUF] = "";
    if (stop_validate(a->stops, a->n_stops, err, sizeof err)) {
        fprintf(stderr, "--stop: %s\n", err);
        return 2;
    }
    return 0;
}

/* Model defaults (generation_config.json) for the sampling flags not given. */
static void gen_apply_defaults(struct gen_args *a, const struct model *m)
{
    if (!a->set_temp && m->gen.temperature >= 0) a->sp.temperature = (float)m->gen.temperature;
    if (!a->set_top_p && m->gen.top_p >= 0) a->sp.top_p = (float)m->gen.top_p;
    if (!a->set_top_k && m->gen.top_k >= 0) a->sp.top_k = m->gen.top_k;
    if (!a->set_rep && m->gen.repetition_penalty > 0) a->sp.repetition_penalty = (float)m->gen.repetition_penalty;
    if (!a->set_seed) a->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
}

/* The text to tokenize for one prompt: the prompt itself, or a conversation of the
 * optional system message and this user message rendered by the chat template. */
static int gen_wrap_text(const struct gen_args *a, const struct model *m, const char *text,
                         char **out, char *err, size_t errlen)
{
    int rc;
    if (!a->chat) {
        *out = strdup(text);
        return *out ? 0 : err_set(err, errlen, ERR_NOMEM, "out of memory");
    }
    struct jinja_template *own = NULL;
    const struct jinja_template *tpl = m->tmpl;
    if (a->chat_template_file) {
        char *src = NULL;
        size_t len = 0;
        if ((rc = read_text_file(a->chat_template_file, &src, &len, err, errlen))) goto done;
        rc = jinja_parse(src, len, &own, err, errlen);
        free(src);
        if (rc) goto done;
        tpl = own;
    }
    if (!tpl) {
        rc = err_set(err, errlen, ERR_INVALID,
                     "%s has no chat template: use --chat-template FILE or drop --chat", m->path);
        goto done;
    }
    cJSON *msgs = cJSON_CreateArray();
    if (a->system) {
        cJSON *sys = cJSON_CreateObject();
        cJSON_AddStringToObject(sys, "role", "system");
        cJSON_AddStringToObject(sys, "content", a->system);
        cJSON_AddItemToArray(msgs, sys);
    }
    cJSON *user = cJSON_CreateObject();
    cJSON_AddStringToObject(user, "role", "user");
    cJSON_AddStringToObject(user, "content", text);
    cJSON_AddItemToArray(msgs, user);
    struct chat_specials sp = { m->bos_token, m->eos_token };
    rc = chat_render(tpl, &sp, msgs, NULL, NULL, true, out, NULL, err, errlen);
    cJSON_Delete(msgs);
done:
    if (own) jinja_free(own);
    return rc;
}

/* Tokenizes the prompt (or parses --tokens) into a malloc'd array. */
static int gen_prompt_ids(const struct gen_args *a, const struct model *m, int32_t **ids, int *n,
                          char *err, size_t errlen)
{
    if (a->tokens) {
        /* the ids were parsed (and the syntax checked) by gen_parse */
        *ids = malloc(sizeof **ids * (size_t)a->n_token_ids);
        if (!*ids) return err_set(err, errlen, ERR_NOMEM, "out of memory");
        memcpy(*ids, a->token_ids, sizeof **ids * (size_t)a->n_token_ids);
        *n = a->n_token_ids;
        for (int i = 0; i < *n; i++)
            if ((*ids)[i] >= m->cfg.vocab_size)
                return err_set(err, errlen, ERR_INVALID, "--tokens: id %d is outside the vocabulary (%d)",
                               (*ids)[i], m->cfg.vocab_size);
        return 0;
    }
    char *text = NULL;
    int rc;
    if (a->prompt_file) {
        if ((rc = read_text_file(a->prompt_file, &text, NULL, err, errlen))) return rc;
    }
    rc = gen_encode_text(a, m, text ? text : a->prompt, ids, n, err, errlen);
    free(text);
    return rc;
}

int gen_encode_text(const struct gen_args *a, const struct model *m, const char *prompt,
                    int32_t **ids, int *n, char *err, size_t errlen)
{
    char *text = NULL;
    *ids = NULL;
    int rc = gen_wrap_text(a, m, prompt, &text, err, errlen);
    if (rc) return rc;
    LOG_DEBUG("generate", "prompt text: %s", text);
    size_t len = strlen(text);
    /* The chat template writes BOS itself when the model wants one (as Hugging Face's
     * apply_chat_template does); a plain prompt gets the tokenizer's BOS rule. */
    bool add_special = !a->chat;
    int cap = (int)(len + 16 < 1 << 30 ? len + 16 : 1 << 30);
    *ids = malloc(sizeof **ids * (size_t)cap);
    if (!*ids) { free(text); return err_set(err, errlen, ERR_NOMEM, "out of memory"); }
    *n = tok_encode(m->tok, text, len, add_special, true, *ids, cap);
    free(text);
    if (*n < 0) return err_set(err, errlen, *n, "tokenization failed (%s)", err_name(*n));
    if (*n > cap) return err_set(err, errlen, ERR_RANGE, "prompt has too many tokens");
    if (*n == 0) return err_set(err, errlen, ERR_INVALID, "the prompt is empty");
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Feeds text to the stop matcher and writes what passed it to stdout (unless print is
 * false: --print-ids still needs the matcher to know where generation ends). Returns 1
 * when a stop string completed. */
static int gen_emit(struct stop_matcher *stop, const char *text, size_t len, bool print)
{
    char out[STOP_MAX_LEN + 256 + 8];
    size_t n_out = 0;
    int hit = 0;
    while (len > 0 && !hit) { /* feed in pieces that fit the output buffer */
        size_t piece = len < 256 ? len : 256;
        hit = stop_feed(stop, text, piece, out, sizeof out, &n_out) == STOP_HIT;
        if (print) fwrite(out, 1, n_out, stdout);
        text += piece;
        len -= piece;
    }
    if (print) fflush(stdout);
    return hit;
}

void gen_backend_config(const struct gen_args *a, struct backend_config *bc)
{
    backend_config_default(bc);
    bc->device = a->device;
    bc->kv_dtype_auto = !a->kv_dtype_set;
    bc->kv_dtype = a->kv_dtype;
    bc->n_threads = a->threads;
    bc->enforce_eager = a->enforce_eager;
    bc->tensor_parallel_size = a->tensor_parallel_size;
    bc->gpu_memory_utilization = a->gpu_memory_utilization;
}

/* Bytes tok_stream_feed may need for any token of m's vocabulary (its documented bound,
 * 3 * length + 4, over the longest token), so no token's text is ever cut. */
int gen_piece_cap(const struct model *m)
{
    int longest = 0, n = tok_vocab_size(m->tok);
    for (int id = 0; id < n; id++) {
        int len = tok_token_bytes(m->tok, id, false, NULL, 0);
        if (len > longest) longest = len;
    }
    return 3 * longest + 8;
}

int cli_generate(int argc, char **argv)
{
    struct gen_args a;
    int rc = gen_parse(argc, argv, &a);
    if (rc) {
        free(a.token_ids);
        return rc;
    }
    char err[ERR_BUF] = "";
    struct model *m = NULL;
    struct runner run = { 0 };
    struct sampler *smp = NULL;
    int32_t *ids = NULL, *out_ids = NULL;
    char *piece = NULL;
    int n_prompt = 0, status = 1, n_steps = 0;

    double t_load = now_s();
    if ((rc = model_load(a.model, a.load_flags, &m, err, sizeof err))) goto fail;
    t_load = now_s() - t_load;
    gen_apply_defaults(&a, m);
    if (a.prompts_file) {
        if ((rc = sampler_params_validate(&a.sp, err, sizeof err))) goto fail;
        if ((status = gen_run_batch(&a, m, err, sizeof err))) goto fail;
        goto done;
    }
    if ((rc = sampler_params_validate(&a.sp, err, sizeof err))) goto fail;
    if ((rc = gen_prompt_ids(&a, m, &ids, &n_prompt, err, sizeof err))) goto fail;

    int ctx = a.ctx > 0 ? a.ctx : (m->cfg.max_seq_len < 4096 ? m->cfg.max_seq_len : 4096);
    if (ctx > m->cfg.max_seq_len) ctx = m->cfg.max_seq_len;
    if (n_prompt >= ctx) {
        rc = err_set(err, sizeof err, ERR_RANGE,
                     "the prompt has %d tokens; the context holds %d, leaving no room to generate (see --ctx)",
                     n_prompt, ctx);
        goto fail;
    }
    int max_new = a.max_tokens < ctx - n_prompt ? a.max_tokens : ctx - n_prompt;
    int piece_cap = gen_piece_cap(m);
    struct backend_config bc;
    gen_backend_config(&a, &bc);
    if ((rc = runner_create(&run, m, &bc, ctx, n_prompt < 256 ? n_prompt : 256, err, sizeof err))) goto fail;
    if (!(smp = sampler_create(&a.sp, m->cfg.vocab_size)) ||
        !(out_ids = malloc(sizeof *out_ids * (size_t)max_new)) ||
        !(piece = malloc((size_t)piece_cap))) {
        rc = err_set(err, sizeof err, ERR_NOMEM, "out of memory");
        goto fail;
    }
    sampler_accept_prompt(smp, ids, n_prompt);
    struct stop_matcher stop;
    stop_init(&stop, a.stops, a.n_stops);
    struct tok_stream ts;
    tok_stream_init(&ts);
    const bool print_text = !a.print_ids;

    double t0 = now_s();
    int32_t tok = -1;
    if ((rc = runner_feed(&run, ids, n_prompt, smp, &tok, err, sizeof err))) goto fail;
    double t_prefill = now_s() - t0;
    int n_gen = 0;
    const char *finish = "length";
    t0 = now_s();
    while (n_gen < max_new) {
        sampler_accept(smp, tok);
        if (!a.ignore_eos && model_is_eog(m, tok)) { finish = "stop"; break; }
        out_ids[n_gen++] = tok;
        /* Text goes through the stop matcher in both modes, so --print-ids ends on the
         * same token as the text mode does. */
        if (print_text || a.n_stops > 0) {
            int len = tok_stream_feed(m->tok, &ts, tok, true, piece, piece_cap);
            if (len < 0) {
                rc = err_set(err, sizeof err, len, "cannot decode token %d (%s)", tok, err_name(len));
                goto fail;
            }
            if (len > 0 && gen_emit(&stop, piece, (size_t)len, print_text)) { finish = "stop"; break; }
        }
        if (n_gen == max_new) break;
        int32_t last = tok;
        if ((rc = runner_feed(&run, &last, 1, smp, &tok, err, sizeof err))) goto fail;
        n_steps++;
    }
    double t_decode = now_s() - t0;
    if (!stop_matched(&stop)) {
        /* the tail: an incomplete UTF-8 character (U+FFFD) and the bytes the stop matcher
         * held back; the tail itself may still complete a stop string */
        char tail[STOP_MAX_LEN + 16];
        int len = tok_stream_flush(&ts, tail, sizeof tail);
        if (len > 0 && gen_emit(&stop, tail, (size_t)len, print_text)) finish = "stop";
        size_t n_out = 0;
        if (stop_flush(&stop, tail, sizeof tail, &n_out) == STOP_CONTINUE && print_text)
            fwrite(tail, 1, n_out, stdout);
    }
    if (a.print_ids)
        for (int i = 0; i < n_gen; i++) printf(i ? " %d" : "%d", out_ids[i]);
    printf("\n");
    fflush(stdout);
    if (!a.quiet)
        fprintf(stderr,
                "[load %.2f s | prompt %d tokens, %.1f tok/s | generated %d tokens, %.1f tok/s | finish: %s]\n",
                t_load, n_prompt, t_prefill > 0 ? n_prompt / t_prefill : 0.0, n_gen,
                t_decode > 0 && n_steps > 0 ? n_steps / t_decode : 0.0, finish);
    status = 0;
    goto done;
fail:
    fprintf(stderr, "generate: %s\n", err);
done:
    free(ids);
    free(out_ids);
    free(piece);
    free(a.token_ids);
    if (smp) sampler_free(smp);
    runner_free(&run);
    if (m) model_free(m);
    return status;
}
