/* logits.c — `tessera logits`: the logits of every position of a token sequence, the
 * contract the reference tests (tests/python) call.
 *
 *   tessera logits --model PATH --tokens 1,2,3 --out FILE [--threads N] [--device D]
 *                  [--kv-dtype f32|f16|bf16|fp8] [--chunk N] [--batch-copies K] [--block-size B]
 *
 * FILE receives little-endian float32 [n_tokens][vocab]. --chunk N feeds the sequence
 * in steps of N tokens (the paged KV cache carries the context across steps);
 * --batch-copies K runs K copies of the sequence as one varlen batch with interleaved
 * block tables, checks every copy against the first, and writes the first.
 * The forward runs on the backend of --device (default cpu: the logits are the
 * reference the tests compare against) through backend_logits.
 * Exit 0 ok, 1 runtime error, 2 usage.
 */
#include "cli/args.h"
#include "cli/cli.h"

#include "backend/backend.h"
#include "model/model.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void logits_usage(FILE *f)
{
    fprintf(f,
            "usage: tessera logits --model PATH --tokens ID,ID,... --out FILE [--threads N]\n"
            "                      [--device cpu|cuda|auto] [--kv-dtype f32|f16|fp16|bf16|fp8]\n"
            "                      [--chunk N] [--batch-copies K] [--block-size B] [--quantization none|q8_0]\n"
            "                      [--dtype auto|bfloat16|float16|half]\n"
            "writes float32 logits [n_tokens][vocab] (little-endian) of every position to FILE\n");
}

int cli_logits(int argc, char **argv)
{
    const char *model_path = NULL, *tokens_arg = NULL, *out_path = NULL;
    int n_threads = 0, chunk = 0, copies = 1, block_size = KV_DEFAULT_BLOCK_SIZE;
    enum kv_dtype kv_dtype = KV_F32;
    bool kv_given = false; /* default: f32 on the CPU (the reference), the backend's choice elsewhere */
    enum backend_device device = BACKEND_DEVICE_CPU;
    unsigned load_flags = 0; /* --quantization, --dtype */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            logits_usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "logits: %s needs a value\n", a);
            logits_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--tokens")) tokens_arg = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--threads")) bad = args_int(a, v, 1, 1024, &n_threads);
        else if (!strcmp(a, "--chunk")) bad = args_int(a, v, 1, 1 << 24, &chunk);
        else if (!strcmp(a, "--batch-copies")) bad = args_int(a, v, 1, 1024, &copies);
        else if (!strcmp(a, "--block-size")) bad = args_int(a, v, 1, 1 << 16, &block_size);
        else if (!strcmp(a, "--quantization") || !strcmp(a, "-q")) bad = args_quantization(a, v, &load_flags);
        else if (!strcmp(a, "--dtype")) bad = args_dtype(a, v, &load_flags);
        else if (!strcmp(a, "--device")) {
            bad = backend_device_parse(v, &device) ? -1 : 0;
            if (bad) fprintf(stderr, "logits: bad value '%s' for %s\n", v, a);
        }
        else if (!strcmp(a, "--kv-dtype")) {
            bad = kv_dtype_parse(v, &kv_dtype) ? -1 : 0;
            kv_given = !bad;
            if (bad) fprintf(stderr, "logits: bad value '%s' for %s\n", v, a);
        }
        else {
            fprintf(stderr, "logits: unknown option '%s'\n", a);
            logits_usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!model_path || !tokens_arg || !out_path) {
        logits_usage(stderr);
        return 2;
    }
    int32_t *tokens = NULL;
    int n = args_ids("--tokens", tokens_arg, &tokens);
    if (n < 0) return 2;
    if (chunk <= 0 || chunk > n) chunk = n;

    char err[ERR_BUF];
    int rc = 1;
    struct model *m = NULL;
    struct backend *be = NULL;
    float *all = NULL;
    int32_t *ids = NULL, *pos = NULL, *qs = NULL, *lens = NULL, *bt = NULL, *li = NULL;
    int64_t *slots = NULL;
    FILE *f = NULL;

    if (model_load(model_path, MODEL_LOAD_NO_TOKENIZER | load_flags, &m, err, sizeof err)) goto fail;
    char desc[MODEL_DESC_MAX];
    model_describe(m, desc, sizeof desc);
    fprintf(stderr, "model: %s\n", desc);
    const int vocab = m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] >= vocab) {
            snprintf(err, sizeof err, "token id %d out of range (vocab %d)", tokens[i], vocab);
            goto fail;
        }

    /* Copy c uses blocks c, c + K, c + 2K, ...: interleaved tables exercise the paging. */
    int bps = (n + block_size - 1) / block_size;
    int rows = chunk * copies;
    struct backend_config bc;
    backend_config_default(&bc);
    bc.device = device;
    bc.max_num_seqs = rows; /* every row's logits */
    bc.max_num_batched_tokens = rows;
    bc.max_model_len = n < m->cfg.max_seq_len ? n : m->cfg.max_seq_len;
    bc.block_size = block_size;
    bc.kv_dtype_auto = !kv_given && device != BACKEND_DEVICE_CPU;
    bc.kv_dtype = kv_dtype;
    bc.num_blocks = bps * copies;
    bc.n_threads = n_threads;
    if (n > m->cfg.max_seq_len) {
        snprintf(err, sizeof err, "%d tokens exceed the model's context length %d", n, m->cfg.max_seq_len);
        goto fail;
    }
    if (backend_create(&be, m, &bc, err, sizeof err)) goto fail;

    all = malloc(sizeof(float) * (size_t)n * vocab);
    ids = malloc(sizeof(int32_t) * rows);
    pos = malloc(sizeof(int32_t) * rows);
    li = malloc(sizeof(int32_t) * rows);
    slots = malloc(sizeof(int64_t) * rows);
    qs = malloc(sizeof(int32_t) * (copies + 1));
    lens = malloc(sizeof(int32_t) * copies);
    bt = malloc(sizeof(int32_t) * (size_t)copies * bps);
    if (!all || !ids || !pos || !li || !slots || !qs || !lens || !bt) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }
    for (int c = 0; c < copies; c++)
        for (int j = 0; j < bps; j++) bt[c * bps + j] = c + j * copies;

    double max_diff = 0.0;
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int len = p0 + chunk < n ? chunk : n - p0, r = 0;
        for (int c = 0; c < copies; c++) {
            qs[c] = r;
            lens[c] = p0 + len;
            for (int i = 0; i < len; i++, r++) {
                int p = p0 + i;
                ids[r] = tokens[p];
                pos[r] = p;
                slots[r] = (int64_t)bt[c * bps + p / block_size] * block_size + p % block_size;
                li[r] = r;
            }
        }
        qs[copies] = r;
        struct batch b = { .num_tokens = r, .num_seqs = copies, .token_ids = ids, .positions = pos,
                           .slot_mapping = slots, .query_start = qs, .seq_lens = lens,
                           .block_tables = bt, .max_blocks_per_seq = bps, .num_logits = r,
                           .logits_indices = li };
        const float *lg = NULL;
        if (backend_logits(be, &b, &lg, err, sizeof err)) goto fail;
        memcpy(all + (size_t)p0 * vocab, lg, sizeof(float) * (size_t)len * vocab);
        for (int c = 1; c < copies; c++) {
            const float *x = lg + (size_t)c * len * vocab;
            for (size_t i = 0; i < (size_t)len * vocab; i++) {
                double d = fabs((double)x[i] - lg[i]);
                if (!(d <= max_diff)) max_diff = d; /* NaN propagates as a failure below */
            }
        }
    }
    for (size_t i = 0; i < (size_t)n * vocab; i++)
        if (!isfinite(all[i])) {
            snprintf(err, sizeof err, "non-finite logit at position %zu", i / vocab);
            goto fail;
        }
    if (copies > 1) {
        fprintf(stderr, "logits: %d batch copies, max |diff| vs the first = %.3g\n", copies, max_diff);
        if (!(max_diff <= 1e-3)) {
            snprintf(err, sizeof err, "batch copies disagree (max |diff| %.3g)", max_diff);
            goto fail;
        }
    }
    /* float32 in host order: every supported host is little-endian */
    if (!(f = fopen(out_path, "wb"))) {
        snprintf(err, sizeof err, "%s: cannot open for writing", out_path);
        goto fail;
    }
    size_t nw = fwrite(all, sizeof(float), (size_t)n * vocab, f);
    int cerr = fclose(f);
    f = NULL;
    if (nw != (size_t)n * vocab || cerr != 0) {
        snprintf(err, sizeof err, "%s: write failed", out_path);
        goto fail;
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "logits: %s\n", err);
    if (f) fclose(f);
    backend_free(be);
    model_free(m);
    free(tokens);
    free(all);
    free(ids);
    free(pos);
    free(li);
    free(slots);
    free(qs);
    free(lens);
    free(bt);
    return rc;
}
