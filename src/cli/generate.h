/* generate.h — what `tessera generate`'s two modes share: the parsed options, prompt
 * encoding, and the batch mode (--prompts-file) that runs many prompts through the
 * continuous-batching scheduler. Used only by src/cli/generate*.c, on the CLI thread. */
#ifndef TESSERA_CLI_GENERATE_H
#define TESSERA_CLI_GENERATE_H

#include "backend/backend.h"
#include "engine/speculative.h"
#include "sampler/sampler.h"
#include "sampler/stop.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct model;

struct gen_args {
    const char *model, *prompt, *prompt_file, *prompts_file, *tokens, *system, *chat_template_file;
    unsigned load_flags;    /* model_load flags: --quantization, --dtype */
    bool chat, print_ids, ignore_eos, quiet;
    int max_tokens, threads, ctx;
    int max_num_seqs, max_num_batched_tokens, kv_cache_mib, kv_blocks; /* --prompts-file engine knobs */
    bool kv_dtype_set;      /* --kv-dtype given (else the backend's choice) */
    enum kv_dtype kv_dtype;
    enum backend_device device;
    bool enforce_eager;
    struct spec_config spec;  /* --speculative-config (--prompts-file); num_tokens 0: off */
    const char *json_schema;  /* --json-schema FILE (--prompts-file): every output matches it */
    int tensor_parallel_size;
    double gpu_memory_utilization;
    const char *stops[STOP_MAX_STRINGS];
    int n_stops;
    int32_t *token_ids;     /* --tokens parsed (malloc'd; freed by cli_generate) */
    int n_token_ids;
    struct sampler_params sp;
    /* which sampling flags were given (the rest come from the model's defaults) */
    bool set_temp, set_top_p, set_top_k, set_rep, set_seed;
};

/* Wraps prompt with the chat template when a->chat, then tokenizes it into a malloc'd
 * array (*ids, caller frees; set even on some errors). */
int gen_encode_text(const struct gen_args *a, const struct model *m, const char *prompt,
                    int32_t **ids, int *n, char *err, size_t errlen);

/* The backend options of a (device, KV dtype, threads, graphs, memory); the caller sets
 * the sizes. */
void gen_backend_config(const struct gen_args *a, struct backend_config *bc);

/* Bytes tok_stream_feed may need for any single token of m's vocabulary. */
int gen_piece_cap(const struct model *m);

/* Batch mode: every non-empty line of a->prompts_file is one prompt; all run through the
 * scheduler together; one JSON line per prompt is printed, in input order. Returns the
 * exit status (0, or 1 with the reason in err). */
int gen_run_batch(const struct gen_args *a, const struct model *m, char *err, size_t errlen);

#endif
