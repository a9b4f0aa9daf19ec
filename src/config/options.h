/* options.h — `tessera serve`'s configuration: one struct, one option table.
 *
 * Every option is declared once in a table (name, type, default, bounds, help) in
 * options.c; that table drives the YAML file parser (libyaml), the command-line parser,
 * validation and `--help`. Order: defaults → YAML file (--config FILE) → command-line
 * flags (flags override the file). YAML keys are the flag names without the leading
 * "--", with '-' or '_' accepted interchangeably ("max-num-seqs" == "max_num_seqs").
 * Flags take "--name value" or "--name=value"; booleans also take "--name" (true) and
 * "--no-name" (false). List options (served-model-name, api-key) accept a YAML sequence or
 * scalar, and repeated flags. The environment variable TESSERA_API_KEY adds a key; the
 * api-key-file (named keys with limits, config/keyfile.h) is checked here and read by
 * the server.
 *
 * Errors name where they come from: "config/x.yaml:12: max-num-seqs: must be between 1
 * and 4096", "--port: not an integer: 'abc'", "unknown option '--prot'". The caller exits
 * with status 2 on any of them.
 *
 * The struct is filled once at start-up and then passed as const; it owns its strings
 * (opts_free).
 */
#ifndef TESSERA_CONFIG_OPTIONS_H
#define TESSERA_CONFIG_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define OPTS_MAX_LIST 16 /* entries of a list option */

struct server_options {
    /* model */
    char *model;                       /* --model PATH (.gguf or HF directory); required */
    char *served_model_name[OPTS_MAX_LIST]; /* aliases; none → the model path's basename */
    int n_served_model_name;
    char *chat_template;               /* file overriding the model's template, or NULL */
    char *load_format;                 /* "auto" (the files' weights) or "dummy" (random weights of
                                          the config's shapes: MODEL_LOAD_DUMMY) */
    bool trust_remote_code;            /* accepted for vLLM compatibility (no model code is run) */
    char *speculative_config;          /* vLLM's --speculative-config JSON (engine/speculative.h),
                                          checked by opts_parse; NULL: off */
    char *quantization;                /* "none" or "q8_0" (F32/F16/BF16 matrices to Q8_0 at load:
                                          MODEL_LOAD_Q8_0) */
    char *dtype;                       /* "auto" (as stored), "bfloat16", "float16" or "half"
                                          (MODEL_LOAD_BF16 / MODEL_LOAD_F16) */
    /* chat output */
    char *tool_call_parser;            /* "auto" (the format the chat template shows, if any),
                                          "none", "hermes", "llama3_json", "mistral",
                                          "deepseek_v3" */
    bool enable_auto_tool_choice;      /* accepted for vLLM compatibility; auto tool choice
                                          works whenever a parser is set or detected */
    char *reasoning_parser;            /* "none", "deepseek_r1", "qwen3" */
    /* http */
    char *host;                        /* "127.0.0.1" */
    int port;                          /* 8000 */
    char *api_key[OPTS_MAX_LIST];      /* --api-key (repeatable) + TESSERA_API_KEY */
    int n_api_key;
    char *api_key_file;                /* named keys with limits (config/keyfile.h); read
                                          by the server, again on SIGHUP; NULL */
    bool public_metrics;               /* /metrics without a key (default true) */
    int64_t max_body_bytes;            /* 16 MiB */
    int64_t max_header_bytes;          /* 64 KiB */
    int max_connections;               /* 1024 */
    int max_connections_per_ip;        /* 256; 0 = unlimited */
    int http_timeout;                  /* seconds, 60 */
    double keepalive_interval;         /* seconds between SSE keep-alive comments, 5 */
    int http_threads;                  /* 1 */
    int api_threads;                   /* parse / template / tokenize workers, 2 */
    int64_t max_stream_queue_bytes;    /* SSE bytes queued per slow client, 4 MiB */
    int response_store_mb;             /* Responses API store (api/response_store.h), 64;
                                          0 = none */
    char *allowed_origins[OPTS_MAX_LIST]; /* CORS (http/cors.h): none = off; "*" = any */
    int n_allowed_origins;
    char *allowed_methods[OPTS_MAX_LIST]; /* none = every method a path serves */
    int n_allowed_methods;
    char *allowed_headers[OPTS_MAX_LIST]; /* none = any */
    int n_allowed_headers;
    bool allow_credentials;            /* false */
    double drain_timeout;              /* seconds live requests get after SIGTERM, 30 */
    /* engine */
    char *scheduling_policy;           /* "fcfs" (arrival order) or "priority" (request
                                          "priority", then arrival) */
    int max_num_seqs;                  /* 64 */
    int max_num_batched_tokens;        /* 0 = auto (2048, at least max_model_len without
                                          chunked prefill) */
    int max_model_len;                 /* 0 = the model's context length, capped at 8192 */
    int block_size;                    /* 16 */
    bool enable_prefix_caching;        /* true */
    bool enable_chunked_prefill;       /* true */
    char *device;                      /* "auto" (the GPU if usable, else the CPU), "cpu", "cuda" */
    char *kv_cache_dtype;              /* "auto", "fp8", "fp8_e4m3", "f16", "fp16", "bf16", "f32" */
    int64_t kv_cache_memory;           /* MiB of KV cache (CPU backend); 0 = auto (1024) */
    double gpu_memory_utilization;     /* 0.9 (CUDA backend; the CPU backend ignores it) */
    bool enforce_eager;                /* CUDA: no CUDA graphs (false) */
    int tensor_parallel_size;          /* CUDA: GPUs the model is split over (1) */
    int threads;                       /* CPU forward threads; 0 = all CPUs */
    int max_queued_requests;           /* 256 */
    int64_t max_queued_tokens;         /* 0 = unlimited */
    /* sampling defaults (override generation_config.json); NaN / -1 = not set */
    double temperature;
    double top_p;
    int top_k;
    double min_p;
    double repetition_penalty;
    int max_tokens;                    /* default max_tokens for requests; 0 = to the limit */
    int max_logprobs;                  /* the most log probabilities per token a request may ask
                                          for (top_logprobs, logprobs, prompt_logprobs) */
    /* logging */
    char *log_level;                   /* "info" */
    bool disable_log_requests;         /* accepted for vLLM compatibility (request contents are
                                          never logged above debug) */
    bool disable_log_stats;            /* accepted for vLLM compatibility (no periodic stats
                                          lines; /metrics has them) */

    char *config_file;                 /* --config, for messages; NULL if none */
};

/* Fills o from argv (argv[0] is the subcommand name and is skipped): defaults, then the
 * --config file if given, then the flags, then a positional MODEL (`tessera serve MODEL`,
 * as in `vllm serve MODEL`; an error together with --model), then TESSERA_API_KEY; the
 * api-key-file is read here only to check it (the server reads it again). Returns 0; 1 if --help was printed to stdout, or
 * --print-config printed the effective YAML to stdout (opts_print_yaml; no model needed):
 * the caller exits 0; or a negative code with "where: key: reason" in err (exit 2).
 * o need not be initialised; on any non-zero return o holds no allocations (opts_free on
 * it is a no-op). Start-up thread only (reads the environment). */
int opts_parse(int argc, char **argv, struct server_options *o, char *err, size_t errlen);
/* Loads only a YAML file into o (on top of what o holds; a list key replaces o's list).
 * Same error format ("FILE:LINE: key: reason"). On error o may be partly updated but stays
 * consistent (free it with opts_free). Does not read api-key-file. */
int opts_load_yaml(struct server_options *o, const char *path, char *err, size_t errlen);
/* Sets every option to its default (owned copies of string defaults). Overwrites o
 * without freeing it: call it on an uninitialised or freed struct. */
void opts_defaults(struct server_options *o);
/* Writes the option list (from the table) to f. */
void opts_print_help(FILE *f);
/* Writes a YAML document with every option's current value to f (for `--print-config`
 * and to check that the file round-trips). */
void opts_print_yaml(const struct server_options *o, FILE *f);
/* Frees o's strings and sets them to NULL (calling it twice is harmless). */
void opts_free(struct server_options *o);

#endif
