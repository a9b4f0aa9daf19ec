/* options.c — see options.h.
 *
 * Owns the option table (opt_table[]): every field of struct server_options except
 * config_file has exactly one row, and every other function here — defaults, the YAML
 * loader, the flag parser, --help and --print-config — walks that table rather than
 * naming fields. A row's `def` is parsed by the same code as a user's value, so a default
 * can never be out of its own bounds without test_options noticing.
 *
 * Invariants: every char * in the struct is NULL or an owned heap string; list options
 * hold exactly n_<name> owned strings. Error messages are "WHERE: KEY: REASON", WHERE being
 * "FILE:LINE" for the YAML file and absent for flags ("--port: not an integer: 'x'").
 */
#define _POSIX_C_SOURCE 200809L
#include "config/options.h"

#include "config/keyfile.h"
#include "engine/speculative.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

enum opt_type { OPT_STR, OPT_INT, OPT_INT64, OPT_DOUBLE, OPT_BOOL, OPT_LIST, OPT_ENUM };

struct opt_def {
    const char *name;     /* flag name without "--", '-' separated ("max-num-seqs") */
    enum opt_type type;
    size_t offset;        /* offsetof(struct server_options, field) */
    size_t count_offset;  /* OPT_LIST: offsetof the int count */
    const char *def;      /* default as text, parsed like a user's value; NULL = unset
                             (NULL string, NaN double, empty list) */
    double min, max;      /* OPT_INT, OPT_INT64, OPT_DOUBLE: inclusive bounds */
    bool min_excl;        /* OPT_DOUBLE: min itself is not allowed (0 < x) */
    const char *choices;  /* OPT_ENUM: "a|b|c" */
    const char *arg;      /* metavar in --help */
    const char *section;  /* --help and --print-config group */
    const char *help;
    bool json_list;       /* OPT_LIST: a value starting with '[' is a JSON array of strings
                             (vLLM's form: --allowed-origins '["*"]') */
};

#define OFF(f) offsetof(struct server_options, f)
#define STR(n, f, d, a, s, h) \
    { .name = n, .type = OPT_STR, .offset = OFF(f), .def = d, .arg = a, .section = s, .help = h }
#define INT(n, f, d, lo, hi, s, h) \
    { .name = n, .type = OPT_INT, .offset = OFF(f), .def = d, .min = lo, .max = hi, \
      .arg = "N", .section = s, .help = h }
#define INT64(n, f, d, lo, hi, s, h) \
    { .name = n, .type = OPT_INT64, .offset = OFF(f), .def = d, .min = lo, .max = hi, \
      .arg = "N", .section = s, .help = h }
#define DBL(n, f, d, lo, excl, hi, s, h) \
    { .name = n, .type = OPT_DOUBLE, .offset = OFF(f), .def = d, .min = lo, .max = hi, \
      .min_excl = excl, .arg = "X", .section = s, .help = h }
#define BOOL(n, f, d, s, h) \
    { .name = n, .type = OPT_BOOL, .offset = OFF(f), .def = d, .section = s, .help = h }
#define LIST(n, f, a, s, h) \
    { .name = n, .type = OPT_LIST, .offset = OFF(f), .count_offset = OFF(n_##f), .arg = a, \
      .section = s, .help = h }
#define JLIST(n, f, a, s, h) \
    { .name = n, .type = OPT_LIST, .offset = OFF(f), .count_offset = OFF(n_##f), .arg = a, \
      .section = s, .help = h, .json_list = true }
#define ENUM(n, f, d, c, s, h) \
    { .name = n, .type = OPT_ENUM, .offset = OFF(f), .def = d, .choices = c, .arg = c, \
      .section = s, .help = h }

static const struct opt_def opt_table[] = {
    STR("model", model, NULL, "PATH", "model",
        "model: a .gguf file or a Hugging Face directory (required; also the positional "
        "argument)"),
    LIST("served-model-name", served_model_name, "NAME", "model",
         "name clients use in \"model\" (repeatable; default: the model path's basename)"),
    STR("chat-template", chat_template, NULL, "FILE", "model",
        "Jinja chat template file overriding the model's own"),
    ENUM("load-format", load_format, "auto", "auto|dummy", "model",
         "auto = the model's weights; dummy = random weights of its config's shapes (benchmarks)"),
    BOOL("trust-remote-code", trust_remote_code, "false", "model",
         "accepted for vLLM compatibility: tessera never runs code from a model directory"),
    ENUM("quantization", quantization, "none", "none|q8_0", "model",
         "q8_0 = quantize F32/F16/BF16 weight matrices to Q8_0 (8.5 bits) at load: about half "
         "the memory and bytes per decode step of BF16; quantized GGUF matrices stay as they are"),
    ENUM("dtype", dtype, "auto", "auto|bfloat16|float16|half", "model",
         "type of the weight matrices (vLLM's flag): auto = as stored; bfloat16 / float16 (half) = "
         "F32/F16/BF16 matrices converted at load; --quantization q8_0 wins over it"),

    ENUM("tool-call-parser", tool_call_parser, "auto", "auto|none|hermes|llama3_json|mistral|deepseek_v3",
         "chat", "format of the model's tool calls, parsed into tool_calls when a request's "
         "tool_choice is auto; auto = the format the chat template shows (none if it shows none)"),
    BOOL("enable-auto-tool-choice", enable_auto_tool_choice, "false", "chat",
         "accepted for vLLM compatibility: tool_choice auto works whenever a tool-call parser is "
         "set or detected"),
    ENUM("reasoning-parser", reasoning_parser, "none", "none|deepseek_r1|qwen3", "chat",
         "split <think>...</think> into reasoning_content (deepseek_r1: the answer starts in the "
         "reasoning; qwen3: when the model or the prompt opens it)"),

    STR("host", host, "127.0.0.1", "ADDR", "http", "address to listen on"),
    INT("port", port, "8000", 1, 65535, "http", "TCP port to listen on"),
    LIST("api-key", api_key, "KEY", "http",
         "accept requests with \"Authorization: Bearer KEY\" (repeatable; none = no auth)"),
    STR("api-key-file", api_key_file, NULL, "FILE", "http",
        "file of named API keys, one 'NAME KEY [rpm=N] [tpm=N]' per line ('#' comments), "
        "added to --api-key; reloaded on SIGHUP"),
    BOOL("public-metrics", public_metrics, "true", "http",
         "serve /metrics without an API key"),
    INT64("max-body-bytes", max_body_bytes, "16777216", 1024, 1099511627776.0, "http",
          "largest request body in bytes (16 MiB)"),
    INT64("max-header-bytes", max_header_bytes, "65536", 1024, 16777216, "http",
          "largest request header block in bytes (64 KiB)"),
    INT("max-connections", max_connections, "1024", 1, 1000000, "http",
        "most open client connections"),
    INT("max-connections-per-ip", max_connections_per_ip, "256", 0, 1000000, "http",
        "most open connections from one client address (behind a reverse proxy: raise it "
        "to max-connections); 0 = unlimited"),
    INT("http-timeout", http_timeout, "60", 1, 86400, "http",
        "seconds an idle connection is kept"),
    DBL("keepalive-interval", keepalive_interval, "5", 0, true, 3600, "http",
        "seconds between SSE keep-alive comments on a quiet stream"),
    INT("http-threads", http_threads, "1", 1, 1024, "http", "HTTP worker threads"),
    INT("api-threads", api_threads, "2", 1, 256, "http",
        "threads that parse request bodies, render chat templates and tokenize prompts "
        "(off the HTTP threads)"),
    INT64("max-stream-queue-bytes", max_stream_queue_bytes, "4194304", 4096, 1099511627776.0,
          "http", "bytes a stream may have queued for a slow client; past it the request is "
          "aborted (4 MiB)"),
    INT("response-store-mb", response_store_mb, "64", 0, 1048576, "http",
        "MiB of memory for /v1/responses responses kept for previous_response_id, "
        "GET /v1/responses/{id} and background runs; the oldest are dropped first; 0 = keep none"),
    JLIST("allowed-origins", allowed_origins, "ORIGIN", "http",
          "origins whose web pages may call the API from a browser (CORS), e.g. "
          "http://localhost:3000, or \"*\" for any (vLLM's default); repeatable or a JSON list; "
          "none = CORS off"),
    JLIST("allowed-methods", allowed_methods, "METHOD", "http",
          "CORS: methods a page may use (default: every method a path serves)"),
    JLIST("allowed-headers", allowed_headers, "NAME", "http",
          "CORS: request headers a page may send (default: any)"),
    BOOL("allow-credentials", allow_credentials, "false", "http",
         "CORS: let pages send credentials (cookies, HTTP auth); the origin is then named, "
         "never \"*\""),
    DBL("drain-timeout", drain_timeout, "30", 0, false, 86400, "http",
        "seconds live requests get to finish after SIGTERM/SIGINT; then they are aborted "
        "(streams get an error event and [DONE])"),

    ENUM("scheduling-policy", scheduling_policy, "fcfs", "fcfs|priority", "engine",
         "the order requests are served in: fcfs = arrival; priority = by each request's "
         "\"priority\" (lower first), then arrival, also choosing which running request a "
         "preemption stops (vLLM's flag)"),
    INT("max-num-seqs", max_num_seqs, "64", 1, 4096, "engine",
        "most sequences in one running batch"),
    INT("max-num-batched-tokens", max_num_batched_tokens, "0", 0, 16777216, "engine",
        "token budget of one engine step; 0 = auto (2048, at least max-model-len without "
        "chunked prefill)"),
    INT("max-model-len", max_model_len, "0", 0, 16777216, "engine",
        "context length (prompt + output); 0 = the model's, capped at 8192"),
    INT("block-size", block_size, "16", 1, 256, "engine", "tokens per KV-cache block"),
    BOOL("enable-prefix-caching", enable_prefix_caching, "true", "engine",
         "reuse KV-cache blocks of shared prompt prefixes"),
    BOOL("enable-chunked-prefill", enable_chunked_prefill, "true", "engine",
         "split long prompts across engine steps"),
    ENUM("device", device, "auto", "auto|cpu|cuda", "engine",
         "compute backend; auto = the GPU when one is usable (libtessera-cuda.so and a device), "
         "else the CPU, with a log line saying why"),
    ENUM("kv-cache-dtype", kv_cache_dtype, "auto", "auto|fp8|fp8_e4m3|f16|fp16|bf16|f32", "engine",
         "element type of the KV cache; auto = the backend's choice (CPU: f16; CUDA: the "
         "model's bf16/f16); fp16 = f16, fp8 = fp8_e4m3"),
    INT64("kv-cache-memory", kv_cache_memory, "0", 0, 16777216, "engine",
          "MiB of KV cache (CPU backend); 0 = auto (1024)"),
    DBL("gpu-memory-utilization", gpu_memory_utilization, "0.9", 0, true, 1, "engine",
        "fraction of GPU memory for weights, activations and KV cache (CUDA backend; the "
        "CPU backend ignores it and sizes its KV cache from kv-cache-memory)"),
    INT("tensor-parallel-size", tensor_parallel_size, "1", 1, 8, "engine",
        "GPUs the model is split over (CUDA backend, NCCL; devices 0..N-1 of CUDA_VISIBLE_DEVICES); "
        "the attention heads and the MLP width must divide by it, the KV heads divide by it or "
        "divide it (each then on several GPUs)"),
    BOOL("enforce-eager", enforce_eager, "false", "engine",
         "CUDA backend: run every step eagerly, without CUDA graphs"),
    STR("speculative-config", speculative_config, NULL, "JSON", "engine",
        "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
        "\"prompt_lookup_max\": 4}' proposes up to 5 tokens that followed an earlier occurrence of the "
        "context's last 4 (prompt_lookup_min..max) tokens and checks them in one step; outputs "
        "unchanged; turns overlapped scheduling off"),
    INT("threads", threads, "0", 0, 4096, "engine", "CPU forward threads; 0 = all CPUs"),
    INT("max-queued-requests", max_queued_requests, "256", 1, 1000000, "engine",
        "requests waiting for a slot before new ones get 429"),
    INT64("max-queued-tokens", max_queued_tokens, "0", 0, 1099511627776.0, "engine",
          "prompt tokens waiting before new requests get 429; 0 = unlimited"),

    DBL("temperature", temperature, NULL, 0, false, 100, "sampling",
        "default temperature; 0 = greedy (unset: generation_config.json, else 1)"),
    DBL("top-p", top_p, NULL, 0, true, 1, "sampling",
        "default nucleus cut-off (unset: generation_config.json, else 1)"),
    INT("top-k", top_k, "-1", -1, 1073741824, "sampling",
        "default top-k; -1 = not set (generation_config.json, else off), 0 = off"),
    DBL("min-p", min_p, NULL, 0, false, 1, "sampling",
        "default min-p (unset: 0 = off)"),
    DBL("repetition-penalty", repetition_penalty, NULL, 0, true, 100, "sampling",
        "default repetition penalty (unset: generation_config.json, else 1 = off)"),
    INT("max-tokens", max_tokens, "0", 0, 1048576, "sampling",
        "default max_tokens of a request; 0 = up to the context length"),
    INT("max-logprobs", max_logprobs, "20", 0, 20, "sampling",
        "most log probabilities per token a request may ask for (top_logprobs, logprobs, "
        "prompt_logprobs); more is a 400, as in vLLM"),

    ENUM("log-level", log_level, "info", "error|warn|info|debug", "logging",
         "least severe message logged"),
    BOOL("disable-log-requests", disable_log_requests, "false", "logging",
         "accepted for vLLM compatibility: prompts and outputs are never logged above debug"),
    BOOL("disable-log-stats", disable_log_stats, "false", "logging",
         "accepted for vLLM compatibility: there are no periodic stats lines (/metrics has them)"),
};
#define N_OPTS ((int)(sizeof opt_table / sizeof opt_table[0]))

/* ---- small helpers ------------------------------------------------------------------ */

static void *field(struct server_options *o, const struct opt_def *d)
{
    return (char *)o + d->offset;
}

static const void *cfield(const struct server_options *o, const struct opt_def *d)
{
    return (const char *)o + d->offset;
}

static int *list_count(struct server_options *o, const struct opt_def *d)
{
    return (int *)((char *)o + d->count_offset);
}

static void list_clear(struct server_options *o, const struct opt_def *d)
{
    char **v = field(o, d);
    int *n = list_count(o, d);
    for (int i = 0; i < *n; i++) {
        free(v[i]);
        v[i] = NULL;
    }
    *n = 0;
}

/* Compares option names treating '-' and '_' alike; a is user input, b a table name. */
static bool name_eq(const char *a, size_t alen, const char *b)
{
    size_t i = 0;
    for (; i < alen && b[i]; i++) {
        char c = a[i] == '_' ? '-' : a[i];
        if (c != b[i]) return false;
    }
    return i == alen && !b[i];
}

static const struct opt_def *opt_find(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (name_eq(name, len, opt_table[i].name)) return &opt_table[i];
    return NULL;
}

/* Edit distance between s (user input, '_' read as '-') and t, for "did you mean". */
static int edit_distance(const char *s, const char *t)
{
    size_t n = strlen(s), m = strlen(t);
    if (n > 64 || m > 64) return INT_MAX;
    int prev[65], cur[65];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        char c = s[i - 1] == '_' ? '-' : s[i - 1];
        for (size_t j = 1; j <= m; j++) {
            int sub = prev[j - 1] + (c != t[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof prev);
    }
    return prev[m];
}

static const char *opt_suggest(const char *name)
{
    const char *best = NULL;
    int bd = 3; /* more than two edits away is not a typo */
    for (int i = 0; i < N_OPTS; i++) {
        int d = edit_distance(name, opt_table[i].name);
        if (d < bd) {
            bd = d;
            best = opt_table[i].name;
        }
    }
    return best;
}

static bool is_bool_word(const char *s, bool *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) { *out = true; return true; }
        if (!strcasecmp(s, no[i])) { *out = false; return true; }
    }
    return false;
}

/* Writes the bounds of d as a reason: "must be between 1 and 4096". */
static void range_reason(const struct opt_def *d, char *why, size_t whylen)
{
    if (d->type == OPT_DOUBLE && d->min_excl)
        snprintf(why, whylen, "must be > %g and <= %g", d->min, d->max);
    else if (d->type == OPT_DOUBLE)
        snprintf(why, whylen, "must be between %g and %g", d->min, d->max);
    else
        snprintf(why, whylen, "must be between %lld and %lld", (long long)d->min,
                 (long long)d->max);
}

static int opt_set(struct server_options *o, const struct opt_def *d, const char *v,
                   bool is_null, char *why, size_t whylen);

/* A list option's value given as a JSON array of non-empty strings: each one is added. */
static int list_add_json(struct server_options *o, const struct opt_def *d, const char *v, char *why,
                         size_t whylen)
{
    cJSON *arr = cJSON_Parse(v);
    int rc = cJSON_IsArray(arr) ? 0 : err_set(why, whylen, ERR_INVALID, "not a JSON list of strings: '%s'", v);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (rc) break;
        if (!cJSON_IsString(it) || *it->valuestring == '[')
            rc = err_set(why, whylen, ERR_INVALID, "not a JSON list of strings: '%s'", v);
        else
            rc = opt_set(o, d, it->valuestring, false, why, whylen);
    }
    cJSON_Delete(arr);
    return rc;
}

/* Sets option d of o from the text v (is_null: the YAML null, which only options that
 * can be unset accept). Lists append v. Returns 0, or a negative code with the reason
 * (no location, no key) in why. */
static int opt_set(struct server_options *o, const struct opt_def *d, const char *v,
                   bool is_null, char *why, size_t whylen)
{
    if (is_null) {
        if (d->type == OPT_LIST) { list_clear(o, d); return 0; }
        if (d->def != NULL) return err_set(why, whylen, ERR_INVALID, "needs a value");
        if (d->type == OPT_DOUBLE) { *(double *)field(o, d) = NAN; return 0; }
        char **s = field(o, d);
        free(*s);
        *s = NULL;
        return 0;
    }
    switch (d->type) {
    case OPT_INT:
    case OPT_INT64: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || isspace((unsigned char)*v) || end == v || *end)
            return err_set(why, whylen, ERR_INVALID, "not an integer: '%s'", v);
        if (errno == ERANGE || (double)x < d->min || (double)x > d->max) {
            range_reason(d, why, whylen);
            return ERR_RANGE;
        }
        if (d->type == OPT_INT) *(int *)field(o, d) = (int)x;
        else *(int64_t *)field(o, d) = (int64_t)x;
        return 0;
    }
    case OPT_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || isspace((unsigned char)*v) || end == v || *end || !isfinite(x))
            return err_set(why, whylen, ERR_INVALID, "not a number: '%s'", v);
        if (x < d->min || x > d->max || (d->min_excl && x == d->min)) {
            range_reason(d, why, whylen);
            return ERR_RANGE;
        }
        *(double *)field(o, d) = x;
        return 0;
    }
    case OPT_BOOL: {
        bool b;
        if (!is_bool_word(v, &b))
            return err_set(why, whylen, ERR_INVALID,
                           "not a boolean (true/false, yes/no, on/off, 1/0): '%s'", v);
        *(bool *)field(o, d) = b;
        return 0;
    }
    case OPT_ENUM: {
        size_t n = strlen(v);
        const char *c = d->choices;
        bool ok = false;
        while (*c && !ok) {
            size_t k = strcspn(c, "|");
            ok = k == n && !strncmp(c, v, n);
            c += k + (c[k] == '|');
        }
        if (!ok) {
            char list[128];
            size_t j = 0;
            for (c = d->choices; *c && j + 3 < sizeof list; c++) {
                if (*c == '|') { list[j++] = ','; list[j++] = ' '; }
                else list[j++] = *c;
            }
            list[j] = 0;
            return err_set(why, whylen, ERR_INVALID, "must be one of %s: '%s'", list, v);
        }
    }
        /* the choice is stored like a string */
        /* fall through */
    case OPT_STR: {
        if (!*v) return err_set(why, whylen, ERR_INVALID, "must not be empty");
        char *s = strdup(v);
        if (!s) return err_set(why, whylen, ERR_NOMEM, "out of memory");
        char **dst = field(o, d);
        free(*dst);
        *dst = s;
        return 0;
    }
    case OPT_LIST: {
        if (!*v) return err_set(why, whylen, ERR_INVALID, "must not be empty");
        if (d->json_list && *v == '[') return list_add_json(o, d, v, why, whylen);
        int *n = list_count(o, d);
        if (*n >= OPTS_MAX_LIST)
            return err_set(why, whylen, ERR_RANGE, "more than %d values", OPTS_MAX_LIST);
        char *s = strdup(v);
        if (!s) return err_set(why, whylen, ERR_NOMEM, "out of memory");
        ((char **)field(o, d))[(*n)++] = s;
        return 0;
    }
    }
    return err_set(why, whylen, ERR_INVALID, "unknown option type");
}

/* Appends key k to the api-key list unless it is already there (so that a printed
 * configuration fed back with the same environment and key file does not double up). */
static int api_key_add(struct server_options *o, const char *k, char *why, size_t whylen)
{
    for (int i = 0; i < o->n_api_key; i++)
        if (!strcmp(o->api_key[i], k)) return 0;
    return opt_set(o, opt_find("api-key", 7), k, false, why, whylen);
}

/* ---- defaults, free ----------------------------------------------------------------- */

void opts_defaults(struct server_options *o)
{
    char why[ERR_BUF];
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt_def *d = &opt_table[i];
        /* the table's defaults are in bounds (test_options checks), so this fails only on
         * allocation failure, which leaves the field NULL */
        (void)opt_set(o, d, d->def, d->def == NULL, why, sizeof why);
    }
}

void opts_free(struct server_options *o)
{
    if (!o) return;
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt_def *d = &opt_table[i];
        if (d->type == OPT_LIST) {
            list_clear(o, d);
        } else if (d->type == OPT_STR || d->type == OPT_ENUM) {
            char **s = field(o, d);
            free(*s);
            *s = NULL;
        }
    }
    free(o->config_file);
    o->config_file = NULL;
}

/* ---- YAML --------------------------------------------------------------------------- */

struct yload {
    yaml_parser_t p;
    const char *path;
    char *err;
    size_t errlen;
};

static int y_next(struct yload *y, yaml_event_t *ev)
{
    if (yaml_parser_parse(&y->p, ev)) return 0;
    return err_set(y->err, y->errlen, ERR_FORMAT, "%s:%zu: syntax error: %s", y->path,
                   y->p.problem_mark.line + 1, y->p.problem ? y->p.problem : "unknown");
}

static bool y_is_null(const yaml_event_t *ev)
{
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = (const char *)ev->data.scalar.value;
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
           !strcmp(s, "NULL");
}

static size_t y_line(const yaml_event_t *ev) { return ev->start_mark.line + 1; }

/* Applies one scalar event to d; key is the spelling used in the file. */
static int y_apply(struct yload *y, struct server_options *o, const struct opt_def *d,
                   const char *key, const yaml_event_t *ev)
{
    char why[ERR_BUF];
    const char *v = (const char *)ev->data.scalar.value;
    if (strlen(v) != ev->data.scalar.length)
        return err_set(y->err, y->errlen, ERR_INVALID, "%s:%zu: %s: contains a NUL byte",
                       y->path, y_line(ev), key);
    int rc = opt_set(o, d, v, y_is_null(ev), why, sizeof why);
    if (rc) return err_set(y->err, y->errlen, rc, "%s:%zu: %s: %s", y->path, y_line(ev), key, why);
    return 0;
}

/* Reads the pairs of the top-level mapping (MAPPING-START already consumed). */
static int y_mapping(struct yload *y, struct server_options *o)
{
    size_t seen[N_OPTS] = {0}; /* line a key was first given on */
    yaml_event_t ev;
    char *key = NULL;
    int rc;
    for (;;) {
        if ((rc = y_next(y, &ev))) goto fail;
        if (ev.type == YAML_MAPPING_END_EVENT) { yaml_event_delete(&ev); break; }
        if (ev.type != YAML_SCALAR_EVENT) {
            rc = err_set(y->err, y->errlen, ERR_FORMAT, "%s:%zu: keys must be option names, not %s",
                         y->path, y_line(&ev),
                         ev.type == YAML_ALIAS_EVENT ? "aliases" : "mappings or lists");
            yaml_event_delete(&ev);
            goto fail;
        }
        size_t line = y_line(&ev);
        key = strdup((const char *)ev.data.scalar.value);
        size_t klen = ev.data.scalar.length;
        yaml_event_delete(&ev);
        if (!key) { rc = err_set(y->err, y->errlen, ERR_NOMEM, "out of memory"); goto fail; }
        const struct opt_def *d = opt_find(key, klen);
        if (!d && name_eq(key, klen, "config")) {
            rc = err_set(y->err, y->errlen, ERR_INVALID,
                         "%s:%zu: %s: not allowed in a config file (use --config on the command "
                         "line)", y->path, line, key);
            goto fail;
        }
        if (!d) {
            const char *s = opt_suggest(key);
            rc = s ? err_set(y->err, y->errlen, ERR_NOT_FOUND,
                             "%s:%zu: %s: unknown option (did you mean '%s'?)", y->path, line,
                             key, s)
                   : err_set(y->err, y->errlen, ERR_NOT_FOUND, "%s:%zu: %s: unknown option",
                             y->path, line, key);
            goto fail;
        }
        int idx = (int)(d - opt_table);
        if (seen[idx]) {
            rc = err_set(y->err, y->errlen, ERR_INVALID,
                         "%s:%zu: %s: duplicate key (first given on line %zu)", y->path, line,
                         key, seen[idx]);
            goto fail;
        }
        seen[idx] = line;

        if ((rc = y_next(y, &ev))) goto fail;
        if (ev.type == YAML_SCALAR_EVENT) {
            if (d->type == OPT_LIST) list_clear(o, d); /* the file's value replaces o's */
            rc = y_apply(y, o, d, key, &ev);
            yaml_event_delete(&ev);
            if (rc) goto fail;
        } else if (ev.type == YAML_SEQUENCE_START_EVENT && d->type == OPT_LIST) {
            yaml_event_delete(&ev);
            list_clear(o, d);
            for (;;) {
                if ((rc = y_next(y, &ev))) goto fail;
                if (ev.type == YAML_SEQUENCE_END_EVENT) { yaml_event_delete(&ev); break; }
                if (ev.type != YAML_SCALAR_EVENT || y_is_null(&ev)) {
                    rc = err_set(y->err, y->errlen, ERR_FORMAT,
                                 "%s:%zu: %s: list items must be non-empty plain values",
                                 y->path, y_line(&ev), key);
                    yaml_event_delete(&ev);
                    goto fail;
                }
                rc = y_apply(y, o, d, key, &ev);
                yaml_event_delete(&ev);
                if (rc) goto fail;
            }
        } else {
            const char *what = ev.type == YAML_SEQUENCE_START_EVENT ? "expected a single value, not a list"
                             : ev.type == YAML_MAPPING_START_EVENT  ? "nested mappings are not supported"
                             : ev.type == YAML_ALIAS_EVENT         ? "aliases are not supported"
                                                                   : "unexpected YAML event";
            rc = err_set(y->err, y->errlen, ERR_FORMAT, "%s:%zu: %s: %s", y->path, y_line(&ev),
                         key, what);
            yaml_event_delete(&ev);
            goto fail;
        }
        free(key);
        key = NULL;
    }
    return 0;
fail:
    free(key);
    return rc;
}

int opts_load_yaml(struct server_options *o, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(err, errlen, ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct yload y = {.path = path, .err = err, .errlen = errlen};
    yaml_event_t ev;
    int rc = 0, docs = 0;
    /* Pass 1 checks the syntax of the whole file, so that a syntax error is reported as
     * such rather than as a strange value ("port: 80\n  host: x" reads "80 host" first). */
    for (int pass = 0; pass < 2; pass++) {
        if (!yaml_parser_initialize(&y.p)) {
            fclose(f);
            return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path);
        }
        yaml_parser_set_input_file(&y.p, f);
        if (pass == 1) break;
        for (;;) {
            if ((rc = y_next(&y, &ev))) break;
            yaml_event_type_t t = ev.type;
            yaml_event_delete(&ev);
            if (t == YAML_STREAM_END_EVENT) break;
        }
        yaml_parser_delete(&y.p);
        if (rc) {
            fclose(f);
            return rc;
        }
        rewind(f);
    }
    for (;;) {
        if ((rc = y_next(&y, &ev))) break;
        yaml_event_type_t t = ev.type;
        size_t line = y_line(&ev);
        bool null_doc = t == YAML_SCALAR_EVENT && y_is_null(&ev);
        yaml_event_delete(&ev);
        if (t == YAML_STREAM_END_EVENT) break;
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_END_EVENT || null_doc) continue;
        if (t == YAML_DOCUMENT_START_EVENT) {
            if (docs++) {
                rc = err_set(err, errlen, ERR_FORMAT, "%s:%zu: only one YAML document is allowed",
                             path, line);
                break;
            }
            continue;
        }
        if (t != YAML_MAPPING_START_EVENT) {
            rc = err_set(err, errlen, ERR_FORMAT,
                         "%s:%zu: the top level must be a mapping of option names to values",
                         path, line);
            break;
        }
        if ((rc = y_mapping(&y, o))) break;
    }
    yaml_parser_delete(&y.p);
    fclose(f);
    return rc;
}

/* ---- command line ------------------------------------------------------------------- */

struct flag_val {
    const struct opt_def *d;
    const char *flag;  /* as written, before any '=' (for messages) */
    size_t flag_len;
    const char *value;
};

/* Checks the api-key-file (the server reads it itself, and again on SIGHUP). */
static int check_key_file(const struct server_options *o, char *err, size_t errlen)
{
    struct keyfile kf;
    char why[ERR_BUF];
    int rc = keyfile_load(o->api_key_file, &kf, why, sizeof why);
    if (rc) return err_set(err, errlen, rc, "api-key-file: %s", why);
    keyfile_free(&kf);
    return 0;
}

int opts_parse(int argc, char **argv, struct server_options *o, char *err, size_t errlen)
{
    struct flag_val *fv = NULL;
    int nfv = 0, rc = 0;
    const char *config = NULL, *positional = NULL;
    bool print_config = false, model_flag = false, only_positional = false;
    char why[ERR_BUF];

    memset(o, 0, sizeof *o);
    fv = calloc((size_t)(argc > 0 ? argc : 1), sizeof *fv);
    if (!fv) return err_set(err, errlen, ERR_NOMEM, "out of memory");

    /* Pass 1: split argv into (option, value) pairs and find --config, so that the file
     * can be loaded before any flag is applied. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_positional || a[0] != '-' || !a[1]) {
            if (a[0] == '-' && !only_positional) {
                rc = err_set(err, errlen, ERR_INVALID, "unknown option '%s' (see --help)", a);
                goto fail;
            }
            if (positional) {
                rc = err_set(err, errlen, ERR_INVALID,
                             "unexpected argument '%s' (the model is already '%s')", a, positional);
                goto fail;
            }
            positional = a;
            continue;
        }
        if (!strcmp(a, "--")) { only_positional = true; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            opts_print_help(stdout);
            free(fv);
            return 1;
        }
        if (!strcmp(a, "-tp")) a = "--tensor-parallel-size"; /* vLLM's short forms */
        if (!strcmp(a, "-q")) a = "--quantization";
        if (a[1] != '-') {
            rc = err_set(err, errlen, ERR_INVALID, "unknown option '%s' (see --help)", a);
            goto fail;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const char *value = eq ? eq + 1 : NULL;
        const struct opt_def *d = opt_find(name, len);
        bool neg = false;
        if (!d && len > 3 && !strncmp(name, "no-", 3)) {
            d = opt_find(name + 3, len - 3);
            if (d && d->type != OPT_BOOL) d = NULL;
            neg = d != NULL;
        }
        bool is_config = !d && name_eq(name, len, "config");
        bool is_print = !d && name_eq(name, len, "print-config");
        if (!d && !is_config && !is_print) {
            rc = err_set(err, errlen, ERR_INVALID, "unknown option '%.*s' (see --help)",
                         (int)(len + 2), a);
            goto fail;
        }
        if ((neg || is_print) && value) {
            rc = err_set(err, errlen, ERR_INVALID, "%.*s: takes no value", (int)(len + 2), a);
            goto fail;
        }
        if (is_print) { print_config = true; continue; }
        if (neg) {
            value = "false";
        } else if (!value && d && d->type == OPT_BOOL) {
            bool b;
            /* "--flag" alone is true; "--flag no" also works */
            if (i + 1 < argc && is_bool_word(argv[i + 1], &b)) value = argv[++i];
            else value = "true";
        } else if (!value) {
            if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] == '-' && argv[i + 1][2])) {
                rc = err_set(err, errlen, ERR_INVALID, "%.*s: needs a value", (int)(len + 2), a);
                goto fail;
            }
            value = argv[++i];
        }
        if (is_config) {
            if (config) {
                rc = err_set(err, errlen, ERR_INVALID, "--config: given twice");
                goto fail;
            }
            config = value;
            continue;
        }
        if (d->offset == offsetof(struct server_options, model)) model_flag = true;
        fv[nfv++] = (struct flag_val){d, a, len + 2, value};
    }
    if (positional && model_flag) {
        rc = err_set(err, errlen, ERR_INVALID,
                     "the model is given twice: '%s' (positional) and --model", positional);
        goto fail;
    }

    /* Pass 2: defaults, the file, the flags, then the positional model. */
    opts_defaults(o);
    if (config) {
        if (!(o->config_file = strdup(config))) {
            rc = err_set(err, errlen, ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((rc = opts_load_yaml(o, config, err, errlen))) goto fail;
    }
    bool replaced[N_OPTS] = {0}; /* list options already cleared by a flag */
    for (int k = 0; k < nfv; k++) {
        const struct opt_def *d = fv[k].d;
        int idx = (int)(d - opt_table);
        if (d->type == OPT_LIST && !replaced[idx]) {
            list_clear(o, d); /* flags replace the file's list */
            replaced[idx] = true;
        }
        if ((rc = opt_set(o, d, fv[k].value, false, why, sizeof why))) {
            rc = err_set(err, errlen, rc, "%.*s: %s", (int)fv[k].flag_len, fv[k].flag, why);
            goto fail;
        }
    }
    if (positional && (rc = opt_set(o, &opt_table[0], positional, false, why, sizeof why))) {
        rc = err_set(err, errlen, rc, "model: %s", why);
        goto fail;
    }
    const char *env = getenv("TESSERA_API_KEY");
    if (env && *env && (rc = api_key_add(o, env, why, sizeof why))) {
        rc = err_set(err, errlen, rc, "TESSERA_API_KEY: api-key: %s", why);
        goto fail;
    }
    if (o->api_key_file && (rc = check_key_file(o, err, errlen))) goto fail;
    struct spec_config spec;
    if ((rc = spec_config_parse(o->speculative_config, &spec, err, errlen))) goto fail;
    if (print_config) {
        opts_print_yaml(o, stdout);
        free(fv);
        opts_free(o);
        return 1;
    }
    if (!o->model) {
        rc = err_set(err, errlen, ERR_INVALID, "--model is required (or model: in the config file)");
        goto fail;
    }
    free(fv);
    return 0;
fail:
    free(fv);
    opts_free(o);
    return rc;
}

/* ---- output ------------------------------------------------------------------------- */

#define HELP_COL 34   /* where descriptions start */
#define HELP_WIDTH 100 /* wrap column */

/* Writes "  FLAG  description" with the description word-wrapped at HELP_WIDTH. */
static void help_line(FILE *f, const char *flag, const char *desc)
{
    int col = fprintf(f, "  %s", flag);
    if (col >= HELP_COL - 1) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", HELP_COL - col, "");
    col = HELP_COL;
    for (const char *w = desc; *w;) {
        while (*w == ' ') w++;
        int n = (int)strcspn(w, " ");
        if (!n) break;
        if (col > HELP_COL && col + 1 + n > HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        } else if (col > HELP_COL) {
            fputc(' ', f);
            col++;
        }
        fwrite(w, 1, (size_t)n, f);
        col += n;
        w += n;
    }
    fputc('\n', f);
}

void opts_print_help(FILE *f)
{
    fprintf(f,
            "usage: tessera serve [MODEL] [--config FILE] [options]\n"
            "\n"
            "Serves MODEL (a .gguf file or a Hugging Face directory) over an OpenAI-compatible\n"
            "HTTP API. Values come from the defaults, then the YAML file given by --config,\n"
            "then these flags (flags win; a list flag replaces the file's list). In the file,\n"
            "keys are the flag names without \"--\" ('-' or '_'). See docs/configuration.md.\n"
            "\n"
            "general:\n");
    help_line(f, "--config FILE", "YAML file of options (config/tessera.yaml is an example)");
    help_line(f, "--print-config", "print the effective configuration as YAML and exit");
    help_line(f, "-h, --help", "print this help and exit");
    const char *section = NULL;
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt_def *d = &opt_table[i];
        if (!section || strcmp(section, d->section)) {
            section = d->section;
            fprintf(f, "%s:\n", section);
        }
        char flag[96], desc[512], extra[128] = "";
        if (d->type == OPT_BOOL) snprintf(flag, sizeof flag, "--[no-]%s", d->name);
        else snprintf(flag, sizeof flag, "--%s %s", d->name, d->arg);
        if (d->type == OPT_INT || d->type == OPT_INT64)
            snprintf(extra, sizeof extra, "%lld..%lld", (long long)d->min, (long long)d->max);
        else if (d->type == OPT_DOUBLE && d->min_excl)
            snprintf(extra, sizeof extra, ">%g..%g", d->min, d->max);
        else if (d->type == OPT_DOUBLE)
            snprintf(extra, sizeof extra, "%g..%g", d->min, d->max);
        if (d->def && d->type != OPT_ENUM)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "%sdefault %s",
                     *extra ? ", " : "", d->def);
        else if (d->def)
            snprintf(extra, sizeof extra, "default %s", d->def);
        snprintf(desc, sizeof desc, *extra ? "%s [%s]" : "%s", d->help, extra);
        help_line(f, flag, desc);
    }
    fprintf(f, "environment:\n");
    help_line(f, "TESSERA_API_KEY", "one more API key, added to those of --api-key and --api-key-file");
}

/* Writes s as a YAML double-quoted scalar. */
static void yaml_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* Shortest %g form of x that reads back as exactly x. */
static void yaml_double(FILE *f, double x)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    fputs(buf, f);
}

void opts_print_yaml(const struct server_options *o, FILE *f)
{
    fprintf(f, "# tessera serve configuration (effective values; see docs/configuration.md)\n");
    const char *section = NULL;
    for (int i = 0; i < N_OPTS; i++) {
        const struct opt_def *d = &opt_table[i];
        if (!section || strcmp(section, d->section)) {
            section = d->section;
            fprintf(f, "\n# %s\n", section);
        }
        fprintf(f, "%s: ", d->name);
        const void *p = cfield(o, d);
        switch (d->type) {
        case OPT_STR:
        case OPT_ENUM: {
            const char *s = *(char *const *)p;
            if (!s) fputs("null", f);
            else if (d->type == OPT_ENUM) fputs(s, f);
            else yaml_quoted(f, s);
            break;
        }
        case OPT_INT: fprintf(f, "%d", *(const int *)p); break;
        case OPT_INT64: fprintf(f, "%" PRId64, *(const int64_t *)p); break;
        case OPT_DOUBLE: {
            double x = *(const double *)p;
            if (isnan(x)) fputs("null", f);
            else yaml_double(f, x);
            break;
        }
        case OPT_BOOL: fputs(*(const bool *)p ? "true" : "false", f); break;
        case OPT_LIST: {
            char *const *v = p;
            int n = *(const int *)((const char *)o + d->count_offset);
            fputc('[', f);
            for (int k = 0; k < n; k++) {
                if (k) fputs(", ", f);
                yaml_quoted(f, v[k]);
            }
            fputc(']', f);
            break;
        }
        }
        fputc('\n', f);
    }
}
