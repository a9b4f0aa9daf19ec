/* test_options.c — config/options.c: defaults, the YAML loader, the flag parser, error
 * messages (exact text and line numbers), the environment and key file, --help,
 * --print-config round trips, and that config/tessera.yaml and docs/configuration.md
 * list every option.
 */
#define _POSIX_C_SOURCE 200809L
#include "config/keyfile.h"
#include "config/options.h"
#include "test.h"
#include "util/err.h"

#include <fcntl.h>
#include <stdarg.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------ */

#define MAX_TMP 256
static char tmp_paths[MAX_TMP][64];
static int n_tmp;

/* Writes text to a new temporary file; returns its path (valid until the end). */
static const char *tmp_file(const char *text)
{
    char *p = tmp_paths[n_tmp++ % MAX_TMP];
    snprintf(p, 64, "/tmp/tessera_opts_XXXXXX");
    int fd = mkstemp(p);
    if (fd < 0) { perror("mkstemp"); exit(1); }
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n) { perror("write"); exit(1); }
    close(fd);
    return p;
}

/* Loads text as a YAML file on top of the defaults; returns opts_load_yaml's result and
 * the message with the temporary path replaced by "F" (so expectations are literal). */
static int load_text(const char *text, struct server_options *o, char *msg, size_t n)
{
    const char *path = tmp_file(text);
    char err[ERR_BUF] = "";
    opts_defaults(o);
    int rc = opts_load_yaml(o, path, err, sizeof err);
    size_t pl = strlen(path);
    if (!strncmp(err, path, pl)) snprintf(msg, n, "F%s", err + pl);
    else snprintf(msg, n, "%s", err);
    return rc;
}

/* opts_parse over a NULL-terminated argument list (argv[0] = "serve"). */
static int parse(struct server_options *o, char *err, size_t errlen, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;
    va_start(ap, errlen);
    argv[argc++] = "serve";
    for (char *a; (a = va_arg(ap, char *)) != NULL;) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    err[0] = 0;
    return opts_parse(argc, argv, o, err, errlen);
}

/* Runs opts_parse with stdout sent to /dev/null (for --help and --print-config). */
static int parse_quiet(struct server_options *o, char *err, size_t errlen, int argc, char **argv)
{
    fflush(stdout);
    int saved = dup(1), null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    close(null);
    int rc = opts_parse(argc, argv, o, err, errlen);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static bool dbl_eq(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Field-by-field comparison; reports the first difference. */
static void check_same(const struct server_options *a, const struct server_options *b,
                       const char *what)
{
#define SAME_S(f) CHECK(str_eq(a->f, b->f), "%s: " #f ": '%s' vs '%s'", what, \
                        a->f ? a->f : "(null)", b->f ? b->f : "(null)")
#define SAME_I(f) CHECK(a->f == b->f, "%s: " #f ": %lld vs %lld", what, (long long)a->f, \
                        (long long)b->f)
#define SAME_D(f) CHECK(dbl_eq(a->f, b->f), "%s: " #f ": %.17g vs %.17g", what, a->f, b->f)
#define SAME_L(f)                                                                   \
    do {                                                                            \
        SAME_I(n_##f);                                                              \
        for (int i_ = 0; i_ < a->n_##f && i_ < b->n_##f; i_++) SAME_S(f[i_]);      \
    } while (0)
    SAME_S(model); SAME_L(served_model_name); SAME_S(chat_template); SAME_S(load_format); SAME_S(quantization); SAME_S(dtype);
    SAME_S(tool_call_parser); SAME_I(enable_auto_tool_choice); SAME_S(reasoning_parser);
    SAME_S(host); SAME_I(port); SAME_L(api_key); SAME_S(api_key_file);
    SAME_I(public_metrics); SAME_I(max_body_bytes); SAME_I(max_header_bytes);
    SAME_I(max_connections); SAME_I(max_connections_per_ip); SAME_I(http_timeout);
    SAME_D(keepalive_interval); SAME_I(http_threads); SAME_D(drain_timeout);
    SAME_I(api_threads); SAME_I(max_stream_queue_bytes); SAME_I(response_store_mb);
    SAME_S(scheduling_policy); SAME_I(max_num_seqs); SAME_I(max_num_batched_tokens); SAME_I(max_model_len);
    SAME_I(block_size); SAME_I(enable_prefix_caching); SAME_I(enable_chunked_prefill);
    SAME_S(device); SAME_S(kv_cache_dtype); SAME_I(kv_cache_memory); SAME_D(gpu_memory_utilization);
    SAME_I(enforce_eager); SAME_I(tensor_parallel_size);
    SAME_I(threads); SAME_I(max_queued_requests); SAME_I(max_queued_tokens);
    SAME_D(temperature); SAME_D(top_p); SAME_I(top_k); SAME_D(min_p);
    SAME_D(repetition_penalty); SAME_I(max_tokens); SAME_S(log_level);
    SAME_I(trust_remote_code); SAME_I(max_logprobs); SAME_I(disable_log_requests); SAME_I(disable_log_stats);
#undef SAME_S
#undef SAME_I
#undef SAME_D
#undef SAME_L
}

/* A struct holding a non-default value in every field, built by hand (not by the code
 * under test). */
static void fill_nondefault(struct server_options *o)
{
    memset(o, 0, sizeof *o);
    o->model = strdup("models/a \"quoted\" \\ path\twith tab.gguf");
    o->served_model_name[0] = strdup("smol");
    o->served_model_name[1] = strdup("héllo: [not a list] # no comment");
    o->n_served_model_name = 2;
    o->chat_template = strdup("t.jinja");
    o->load_format = strdup("dummy");
    o->quantization = strdup("q8_0");
    o->dtype = strdup("half");
    o->tool_call_parser = strdup("llama3_json");
    o->enable_auto_tool_choice = true;
    o->reasoning_parser = strdup("qwen3");
    o->host = strdup("0.0.0.0");
    o->port = 9001;
    o->api_key[0] = strdup("k1");
    o->n_api_key = 1;
    o->api_key_file = NULL;
    o->public_metrics = false;
    o->max_body_bytes = 5000000000LL;
    o->max_header_bytes = 2048;
    o->max_connections = 7;
    o->max_connections_per_ip = 3;
    o->http_timeout = 5;
    o->keepalive_interval = 0.1;
    o->http_threads = 4;
    o->drain_timeout = 2.5;
    o->api_threads = 3;
    o->max_stream_queue_bytes = 65536;
    o->response_store_mb = 0;
    o->scheduling_policy = strdup("priority");
    o->max_num_seqs = 4096;
    o->max_num_batched_tokens = 1;
    o->max_model_len = 4096;
    o->block_size = 32;
    o->enable_prefix_caching = false;
    o->enable_chunked_prefill = false;
    o->device = strdup("cuda");
    o->kv_cache_dtype = strdup("fp8_e4m3");
    o->kv_cache_memory = 512;
    o->gpu_memory_utilization = 1.0 / 3.0;
    o->enforce_eager = true;
    o->tensor_parallel_size = 2;
    o->threads = 8;
    o->max_queued_requests = 1;
    o->max_queued_tokens = 100000;
    o->temperature = 0;
    o->top_p = 0.95;
    o->top_k = 40;
    o->min_p = 0.05;
    o->repetition_penalty = 1.1;
    o->max_tokens = 100;
    o->log_level = strdup("debug");
    o->trust_remote_code = true;
    o->max_logprobs = 7;
    o->disable_log_requests = true;
    o->disable_log_stats = true;
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_defaults(void)
{
    struct server_options o;
    opts_defaults(&o);
    CHECK(o.model == NULL, "model");
    CHECK(o.n_served_model_name == 0 && o.chat_template == NULL, "model section");
    CHECK(str_eq(o.host, "127.0.0.1") && o.port == 8000, "host %s port %d", o.host, o.port);
    CHECK(o.n_api_key == 0 && o.api_key_file == NULL && o.public_metrics, "auth");
    CHECK(o.max_body_bytes == 16 << 20 && o.max_header_bytes == 64 << 10, "sizes");
    /* a per-client limit by default, so one client cannot hold every connection */
    CHECK(o.max_connections == 1024 && o.max_connections_per_ip == 256, "conns %d",
          o.max_connections_per_ip);
    CHECK(o.api_threads == 2 && o.max_stream_queue_bytes == 4 << 20, "api threads, stream queue");
    CHECK(o.response_store_mb == 64 && str_eq(o.scheduling_policy, "fcfs"), "response store, policy");
    CHECK(o.http_timeout == 60 && o.keepalive_interval == 5 && o.http_threads == 1 &&
          o.drain_timeout == 30, "http");
    CHECK(o.max_num_seqs == 64 && o.max_num_batched_tokens == 0 && o.max_model_len == 0, "eng");
    CHECK(o.block_size == 16 && o.enable_prefix_caching && o.enable_chunked_prefill, "blocks");
    CHECK(str_eq(o.kv_cache_dtype, "auto") && o.kv_cache_memory == 0, "kv");
    CHECK(o.gpu_memory_utilization == 0.9 && o.threads == 0, "gpu/threads");
    CHECK(str_eq(o.device, "auto") && !o.enforce_eager, "device %s eager %d", o.device, o.enforce_eager);
    CHECK(o.tensor_parallel_size == 1, "tensor_parallel_size %d", o.tensor_parallel_size);
    CHECK(o.max_queued_requests == 256 && o.max_queued_tokens == 0, "queue");
    CHECK(isnan(o.temperature) && isnan(o.top_p) && o.top_k == -1 && isnan(o.min_p) &&
              isnan(o.repetition_penalty) && o.max_tokens == 0, "sampling");
    CHECK(str_eq(o.log_level, "info") && o.config_file == NULL, "log");
    opts_free(&o);
    opts_free(&o); /* idempotent */
}

static void test_yaml_every_type(void)
{
    const char *y =
        "# every option, mixed spellings\n"
        "model: \"models/a \\\"quoted\\\" \\\\ path\\twith tab.gguf\"\n"
        "served_model_name:\n"
        "  - smol\n"
        "  - 'héllo: [not a list] # no comment'\n"
        "chat-template: t.jinja\n"
        "load_format: dummy\n"
        "quantization: q8_0\n"
        "dtype: half\n"
        "tool_call_parser: llama3_json\n"
        "enable-auto-tool-choice: true\n"
        "reasoning-parser: qwen3\n"
        "host: 0.0.0.0\n"
        "port: 9001\n"
        "api_key: k1          # a scalar for a list option\n"
        "api-key-file: ~\n"
        "public_metrics: no\n"
        "max-body-bytes: 5000000000\n"
        "max_header_bytes: 2048\n"
        "max-connections: 7\n"
        "max-connections-per-ip: 3\n"
        "http_timeout: 5\n"
        "keepalive-interval: 0.1\n"
        "drain-timeout: 2.5\n"
        "api-threads: 3\n"
        "max-stream-queue-bytes: 65536\n"
        "response-store-mb: 0\n"
        "scheduling-policy: priority\n"
        "http-threads: \"4\"\n"
        "max-num-seqs: 4096\n"
        "max_num_batched_tokens: 1\n"
        "max-model-len: 4096\n"
        "block-size: 32\n"
        "enable-prefix-caching: off\n"
        "enable_chunked_prefill: FALSE\n"
        "device: cuda\n"
        "kv-cache-dtype: fp8_e4m3\n"
        "kv_cache_memory: 512\n"
        "gpu-memory-utilization: 0.33333333333333331\n"
        "enforce_eager: true\n"
        "tensor-parallel-size: 2\n"
        "threads: 8\n"
        "max-queued-requests: 1\n"
        "max-queued-tokens: 100000\n"
        "temperature: 0\n"
        "top-p: 0.95\n"
        "top_k: 40\n"
        "min-p: 5e-2\n"
        "repetition-penalty: 1.1\n"
        "max-tokens: 100\n"
        "max-logprobs: 7\n"
        "trust-remote-code: true\n"
        "disable_log_requests: yes\n"
        "disable-log-stats: on\n"
        "log_level: debug\n";
    struct server_options o, want;
    char msg[ERR_BUF];
    int rc = load_text(y, &o, msg, sizeof msg);
    CHECK(rc == 0, "rc %d: %s", rc, msg);
    fill_nondefault(&want);
    check_same(&o, &want, "yaml");
    opts_free(&o);
    opts_free(&want);
}

static void test_yaml_forms(void)
{
    struct server_options o;
    char msg[ERR_BUF];
    /* flow sequence; null empties a list and unsets an optional value */
    int rc = load_text("api-key: [a, \"b\", 'c']\nserved-model-name: []\ntemperature: 0.5\n",
                       &o, msg, sizeof msg);
    CHECK(rc == 0 && o.n_api_key == 3 && str_eq(o.api_key[1], "b") &&
              o.n_served_model_name == 0 && o.temperature == 0.5, "flow: %d %s", rc, msg);
    opts_free(&o);
    rc = load_text("api-key:\nchat-template: null\ntemperature: ~\n", &o, msg, sizeof msg);
    CHECK(rc == 0 && o.n_api_key == 0 && !o.chat_template && isnan(o.temperature), "null: %s", msg);
    opts_free(&o);
    /* an empty file, a comment-only file, an explicit empty document: the defaults */
    const char *empties[] = {"", "# nothing\n\n", "---\n", "--- {}\n...\n"};
    for (int i = 0; i < 4; i++) {
        rc = load_text(empties[i], &o, msg, sizeof msg);
        CHECK(rc == 0 && o.port == 8000, "empty %d: %s", i, msg);
        opts_free(&o);
    }
    /* a quoted "null" is a string, not null; the file's list replaces what o held */
    opts_defaults(&o);
    o.api_key[0] = strdup("old");
    o.n_api_key = 1;
    const char *p = tmp_file("chat-template: \"null\"\napi-key: [new]\n");
    rc = opts_load_yaml(&o, p, msg, sizeof msg);
    CHECK(rc == 0 && str_eq(o.chat_template, "null") && o.n_api_key == 1 &&
              str_eq(o.api_key[0], "new"), "quoted null / replace: %s", msg);
    opts_free(&o);
    /* anchors are harmless */
    rc = load_text("port: &p 9000\n", &o, msg, sizeof msg);
    CHECK(rc == 0 && o.port == 9000, "anchor: %s", msg);
    opts_free(&o);
}

struct yaml_case {
    const char *text, *want;
};

static void test_yaml_errors(void)
{
    static const struct yaml_case cases[] = {
        {"host: a\nport: 80\nmax-num-seqs: 0\n", "F:3: max-num-seqs: must be between 1 and 4096"},
        {"port: abc\n", "F:1: port: not an integer: 'abc'"},
        {"port: 80x\n", "F:1: port: not an integer: '80x'"},
        {"port: 1.5\n", "F:1: port: not an integer: '1.5'"},
        {"port: 1e3\n", "F:1: port: not an integer: '1e3'"},
        {"port: 65536\n", "F:1: port: must be between 1 and 65535"},
        {"max-body-bytes: 99999999999999999999\n",
         "F:1: max-body-bytes: must be between 1024 and 1099511627776"},
        {"max_queued_tokens: -1\n", "F:1: max_queued_tokens: must be between 0 and 1099511627776"},
        {"\n\npublic-metrics: maybe\n",
         "F:3: public-metrics: not a boolean (true/false, yes/no, on/off, 1/0): 'maybe'"},
        {"temperature: hot\n", "F:1: temperature: not a number: 'hot'"},
        {"temperature: .inf\n", "F:1: temperature: not a number: '.inf'"},
        {"temperature: nan\n", "F:1: temperature: not a number: 'nan'"},
        {"temperature: -0.5\n", "F:1: temperature: must be between 0 and 100"},
        {"gpu-memory-utilization: 0\n", "F:1: gpu-memory-utilization: must be > 0 and <= 1"},
        {"gpu-memory-utilization: 1.01\n", "F:1: gpu-memory-utilization: must be > 0 and <= 1"},
        {"kv-cache-dtype: int4\n",
         "F:1: kv-cache-dtype: must be one of auto, fp8, fp8_e4m3, f16, fp16, bf16, f32: 'int4'"},
        {"device: tpu\n", "F:1: device: must be one of auto, cpu, cuda: 'tpu'"},
        {"log-level: verbose\n", "F:1: log-level: must be one of error, warn, info, debug: 'verbose'"},
        {"host: \"\"\n", "F:1: host: must not be empty"},
        {"port:\n", "F:1: port: needs a value"},
        {"block-size: ~\n", "F:1: block-size: needs a value"},
        {"api-key: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]\n",
         "F:1: api-key: more than 16 values"},
        {"api-key:\n  - a\n  - [b]\n", "F:3: api-key: list items must be non-empty plain values"},
        {"api-key:\n  - a\n  -\n", "F:3: api-key: list items must be non-empty plain values"},
        {"port: 80\nprot: 81\n", "F:2: prot: unknown option (did you mean 'port'?)"},
        {"frobnicate: 1\n", "F:1: frobnicate: unknown option"},
        {"port: 80\nhost: x\nport: 81\n", "F:3: port: duplicate key (first given on line 1)"},
        {"max-num-seqs: 8\nmax_num_seqs: 9\n",
         "F:2: max_num_seqs: duplicate key (first given on line 1)"},
        {"port: 80\nhttp:\n  port: 81\n", "F:2: http: unknown option"},
        {"port:\n  value: 81\n", "F:2: port: nested mappings are not supported"},
        {"port: [80]\n", "F:1: port: expected a single value, not a list"},
        {"a: &x 1\nport: *x\n", "F:1: a: unknown option"},
        {"port: &x 1\nhttp-timeout: *x\n", "F:2: http-timeout: aliases are not supported"},
        {"config: other.yaml\n",
         "F:1: config: not allowed in a config file (use --config on the command line)"},
        {"- port\n- 80\n", "F:1: the top level must be a mapping of option names to values"},
        {"just a string\n", "F:1: the top level must be a mapping of option names to values"},
        {"port: 80\n---\nport: 81\n", "F:2: only one YAML document is allowed"},
        {"port: 80\napi-key: [a\n", "F:3: syntax error: did not find expected ',' or ']'"},
        {"port: 80\n  host: x\n", "F:2: syntax error: mapping values are not allowed in this context"},
        {"port: \"80\n", "F:2: syntax error: found unexpected end of stream"},
        {"port: 0\nhost: x\nmodel: [\n", "F:4: syntax error: did not find expected node content"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct server_options o;
        char msg[ERR_BUF];
        int rc = load_text(cases[i].text, &o, msg, sizeof msg);
        CHECK(rc < 0, "case %zu accepted: %s", i, cases[i].text);
        CHECK(!strcmp(msg, cases[i].want), "case %zu:\n    got  '%s'\n    want '%s'", i, msg,
              cases[i].want);
        opts_free(&o);
    }
}

static void test_yaml_missing_file(void)
{
    struct server_options o;
    char err[ERR_BUF];
    opts_defaults(&o);
    int rc = opts_load_yaml(&o, "/nonexistent/t.yaml", err, sizeof err);
    CHECK(rc == ERR_IO, "rc %d", rc);
    CHECK(!strcmp(err, "/nonexistent/t.yaml: cannot open: No such file or directory"), "%s", err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "--config", "/nonexistent/t.yaml", "m.gguf", NULL);
    CHECK(rc < 0 && !strcmp(err, "/nonexistent/t.yaml: cannot open: No such file or directory"),
          "%s", err);
    opts_free(&o);
}

static void test_flags_override_yaml(void)
{
    const char *p = tmp_file("model: file.gguf\nport: 9000\napi-key: [a, b]\n"
                             "served-model-name: [x, y]\ntemperature: 0.7\n");
    struct server_options o;
    char err[ERR_BUF];
    int rc = parse(&o, err, sizeof err, "--port=9100", "--config", p, "--api-key", "c",
                   "--api-key=d", "--temperature", "0", NULL);
    CHECK(rc == 0, "rc %d %s", rc, err);
    CHECK(str_eq(o.model, "file.gguf") && o.port == 9100 && o.temperature == 0, "scalars");
    CHECK(o.n_api_key == 2 && str_eq(o.api_key[0], "c") && str_eq(o.api_key[1], "d"),
          "flags replace the file's list: n=%d", o.n_api_key);
    CHECK(o.n_served_model_name == 2 && str_eq(o.served_model_name[1], "y"), "file list kept");
    CHECK(str_eq(o.config_file, p), "config_file");
    opts_free(&o);
}

static void test_flag_forms(void)
{
    struct server_options o;
    char err[ERR_BUF];
    int rc = parse(&o, err, sizeof err, "--model", "m.gguf", "--max-num-seqs=8",
                   "--max_model_len", "1024", "--no-enable-prefix-caching",
                   "--public-metrics", "no", "--enable-chunked-prefill=off",
                   "--top-k", "-1", "--min-p", "0", "--served-model-name", "a",
                   "--served-model-name", "b", "--host=::1", "--kv-cache-dtype", "f16",
                   "--log-level=warn", "--max-body-bytes", "2048", "--keepalive-interval=2.5",
                   NULL);
    CHECK(rc == 0, "rc %d %s", rc, err);
    CHECK(str_eq(o.model, "m.gguf") && o.max_num_seqs == 8 && o.max_model_len == 1024, "ints");
    CHECK(!o.enable_prefix_caching && !o.public_metrics && !o.enable_chunked_prefill, "bools");
    CHECK(o.top_k == -1 && o.min_p == 0 && o.keepalive_interval == 2.5, "sampling");
    CHECK(o.n_served_model_name == 2 && str_eq(o.served_model_name[1], "b"), "repeat");
    CHECK(str_eq(o.host, "::1") && str_eq(o.kv_cache_dtype, "f16") && str_eq(o.log_level, "warn"),
          "strings");
    CHECK(o.max_body_bytes == 2048 && o.config_file == NULL, "int64");
    opts_free(&o);
    /* a bare boolean flag is true and does not swallow the positional model */
    const char *p = tmp_file("public-metrics: false\nenable-prefix-caching: false\n");
    rc = parse(&o, err, sizeof err, "--config", p, "--public-metrics", "m.gguf",
               "--enable-prefix-caching", NULL);
    CHECK(rc == 0 && o.public_metrics && o.enable_prefix_caching && str_eq(o.model, "m.gguf"),
          "bare bool: %d %s", rc, err);
    opts_free(&o);
    /* CORS lists: vLLM's JSON form and repeated flags; other lists take '[' literally */
    rc = parse(&o, err, sizeof err, "m.gguf", "--allowed-origins", "[\"http://a:3000\", \"*\"]",
               "--allowed-origins", "http://b", "--allow-credentials", "--allowed-headers", "[]",
               "--api-key", "[k", NULL);
    CHECK(rc == 0, "cors: rc %d %s", rc, err);
    CHECK(o.n_allowed_origins == 3 && str_eq(o.allowed_origins[0], "http://a:3000") &&
              str_eq(o.allowed_origins[1], "*") && str_eq(o.allowed_origins[2], "http://b"),
          "allowed-origins: %d", o.n_allowed_origins);
    CHECK(o.allow_credentials && o.n_allowed_headers == 0 && o.n_allowed_methods == 0, "cors others");
    CHECK(o.n_api_key == 1 && str_eq(o.api_key[0], "[k"), "api-key '[k' literal");
    opts_free(&o);
    /* "--" ends the options */
    rc = parse(&o, err, sizeof err, "--port", "81", "--", "-odd-name.gguf", NULL);
    CHECK(rc == 0 && str_eq(o.model, "-odd-name.gguf") && o.port == 81, "--: %s", err);
    opts_free(&o);
}

struct flag_case {
    const char *args[6], *want;
};

static void test_flag_errors(void)
{
    static const struct flag_case cases[] = {
        {{"m", "--prot", "80"}, "unknown option '--prot' (see --help)"},
        {{"m", "--prot=80"}, "unknown option '--prot' (see --help)"},
        {{"m", "-p", "80"}, "unknown option '-p' (see --help)"},
        {{"m", "--no-port"}, "unknown option '--no-port' (see --help)"},
        {{"m", "--port"}, "--port: needs a value"},
        {{"m", "--api-key", "--port", "80"}, "--api-key: needs a value"},
        {{"m", "--port", "abc"}, "--port: not an integer: 'abc'"},
        {{"m", "--port=0"}, "--port: must be between 1 and 65535"},
        {{"m", "--port", "99999999999999999999999"}, "--port: must be between 1 and 65535"},
        {{"m", "--max_num_seqs", "5000"}, "--max_num_seqs: must be between 1 and 4096"},
        {{"m", "--temperature", "inf"}, "--temperature: not a number: 'inf'"},
        {{"m", "--top-p", "0"}, "--top-p: must be > 0 and <= 1"},
        {{"m", "--public-metrics=maybe"},
         "--public-metrics: not a boolean (true/false, yes/no, on/off, 1/0): 'maybe'"},
        {{"m", "--no-public-metrics=1"}, "--no-public-metrics: takes no value"},
        {{"m", "--log-level", "trace"},
         "--log-level: must be one of error, warn, info, debug: 'trace'"},
        {{"m", "--model", "n"}, "the model is given twice: 'm' (positional) and --model"},
        {{"m", "n"}, "unexpected argument 'n' (the model is already 'm')"},
        {{"--port", "80"}, "--model is required (or model: in the config file)"},
        {{"m", "--config", "a", "--config", "b"}, "--config: given twice"},
        {{"m", "--print-config=yes"}, "--print-config: takes no value"},
        {{"m", "--host="}, "--host: must not be empty"},
        {{"m", "--allowed-origins", "[1]"}, "--allowed-origins: not a JSON list of strings: '[1]'"},
        {{"m", "--allowed-origins", "[\"a\""}, "--allowed-origins: not a JSON list of strings: '[\"a\"'"},
        {{"m", "--allowed-methods", "[\"\"]"}, "--allowed-methods: must not be empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[8] = {"serve"};
        int argc = 1;
        for (int k = 0; k < 6 && cases[i].args[k]; k++) argv[argc++] = (char *)cases[i].args[k];
        struct server_options o;
        char err[ERR_BUF] = "";
        int rc = opts_parse(argc, argv, &o, err, sizeof err);
        CHECK(rc < 0, "case %zu accepted", i);
        CHECK(!strcmp(err, cases[i].want), "case %zu:\n    got  '%s'\n    want '%s'", i, err,
              cases[i].want);
        CHECK(o.host == NULL && o.log_level == NULL, "case %zu: o not freed on error", i);
        opts_free(&o);
    }
    /* 17 --api-key flags overflow the list */
    char *argv[40] = {"serve", "m"};
    int argc = 2;
    for (int k = 0; k < 17; k++) { argv[argc++] = "--api-key"; argv[argc++] = "k"; }
    struct server_options o;
    char err[ERR_BUF];
    int rc = opts_parse(argc, argv, &o, err, sizeof err);
    CHECK(rc < 0 && !strcmp(err, "--api-key: more than 16 values"), "overflow: %s", err);
    opts_free(&o);
}

static void test_yaml_error_through_parse(void)
{
    const char *p = tmp_file("model: m\n\nmax-num-seqs: 0\n");
    struct server_options o;
    char err[ERR_BUF], want[ERR_BUF];
    int rc = parse(&o, err, sizeof err, "--config", p, NULL);
    snprintf(want, sizeof want, "%s:3: max-num-seqs: must be between 1 and 4096", p);
    CHECK(rc < 0 && !strcmp(err, want), "got '%s'", err);
    opts_free(&o);
}

static void test_help(void)
{
    struct server_options o;
    char err[ERR_BUF] = "";
    char *a1[] = {"serve", "--help", NULL}, *a2[] = {"serve", "m", "-h", "--bogus", NULL};
    CHECK(parse_quiet(&o, err, sizeof err, 2, a1) == 1, "--help");
    opts_free(&o);
    CHECK(parse_quiet(&o, err, sizeof err, 4, a2) == 1, "-h");
    opts_free(&o);
    /* the help names every option (taken from --print-config's keys) with its default */
    FILE *f = tmpfile(), *y = tmpfile();
    opts_print_help(f);
    opts_defaults(&o);
    opts_print_yaml(&o, y);
    opts_free(&o);
    long n = ftell(f);
    char *help = calloc(1, (size_t)n + 1);
    rewind(f);
    CHECK(fread(help, 1, (size_t)n, f) == (size_t)n, "read help");
    rewind(y);
    char line[512];
    int keys = 0;
    while (fgets(line, sizeof line, y)) {
        char *colon = strchr(line, ':');
        if (line[0] == '#' || line[0] == '\n' || !colon) continue;
        *colon = 0;
        char flag[600], bflag[600];
        snprintf(flag, sizeof flag, "--%s ", line);
        snprintf(bflag, sizeof bflag, "--[no-]%s ", line);
        CHECK(strstr(help, flag) || strstr(help, bflag), "--help lacks %s", line);
        keys++;
    }
    CHECK(keys == 57, "%d keys", keys); /* one per option of the table */
    CHECK(strstr(help, "--max-num-seqs N") && strstr(help, "[1..4096, default 64]"), "%s", help);
    CHECK(strstr(help, "--[no-]enable-prefix-caching") && strstr(help, "\nengine:\n"), "bool/section");
    CHECK(strstr(help, "--config FILE") && strstr(help, "--print-config"), "general");
    free(help);
    fclose(f);
    fclose(y);
}

static void test_positional_model(void)
{
    struct server_options o;
    char err[ERR_BUF];
    const char *p = tmp_file("model: from-file.gguf\n");
    int rc = parse(&o, err, sizeof err, "models/x.gguf", "--port", "8080", NULL);
    CHECK(rc == 0 && str_eq(o.model, "models/x.gguf") && o.port == 8080, "%d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "--config", p, "pos.gguf", NULL);
    CHECK(rc == 0 && str_eq(o.model, "pos.gguf"), "positional overrides file: %s", err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "--config", p, NULL);
    CHECK(rc == 0 && str_eq(o.model, "from-file.gguf"), "file model: %s", err);
    opts_free(&o);
}

static void test_env_api_key(void)
{
    struct server_options o;
    char err[ERR_BUF];
    setenv("TESSERA_API_KEY", "envkey", 1);
    int rc = parse(&o, err, sizeof err, "m", "--api-key", "a", NULL);
    CHECK(rc == 0 && o.n_api_key == 2 && str_eq(o.api_key[0], "a") &&
              str_eq(o.api_key[1], "envkey"), "env after flags: n=%d", o.n_api_key);
    opts_free(&o);
    /* a key already present is not added twice */
    rc = parse(&o, err, sizeof err, "m", "--api-key", "envkey", NULL);
    CHECK(rc == 0 && o.n_api_key == 1, "dedupe: n=%d", o.n_api_key);
    opts_free(&o);
    /* full list → error naming the source */
    char *argv[40] = {"serve", "m"};
    int argc = 2;
    char keys[16][16];
    for (int k = 0; k < 16; k++) {
        snprintf(keys[k], sizeof keys[k], "k%d", k);
        argv[argc++] = "--api-key";
        argv[argc++] = keys[k];
    }
    rc = opts_parse(argc, argv, &o, err, sizeof err);
    CHECK(rc < 0 && !strcmp(err, "TESSERA_API_KEY: api-key: more than 16 values"), "%s", err);
    opts_free(&o);
    setenv("TESSERA_API_KEY", "", 1);
    rc = parse(&o, err, sizeof err, "m", NULL);
    CHECK(rc == 0 && o.n_api_key == 0, "empty env ignored");
    opts_free(&o);
    unsetenv("TESSERA_API_KEY");
    rc = parse(&o, err, sizeof err, "m", NULL);
    CHECK(rc == 0 && o.n_api_key == 0, "unset env");
    opts_free(&o);
}

static void test_api_key_file(void)
{
    struct server_options o;
    char err[ERR_BUF], want[ERR_BUF];
    unsetenv("TESSERA_API_KEY");
    /* the file is checked here but read by the server: its keys are not in api_key (and so
       not in --print-config's output) */
    const char *kf = tmp_file("# keys for the staging clients\n\n  alpha sk-alpha rpm=60 \n"
                              "\tbeta sk-beta\ttpm=1000 rpm=5\r\nsk-bare\n#gamma\n");
    int rc = parse(&o, err, sizeof err, "m", "--api-key", "flag", "--api-key-file", kf, NULL);
    CHECK(rc == 0, "%s", err);
    CHECK(o.n_api_key == 1 && str_eq(o.api_key[0], "flag"), "n=%d", o.n_api_key);
    CHECK(str_eq(o.api_key_file, kf), "path kept");
    opts_free(&o);
    /* the file may be named in YAML too */
    char yaml[256];
    snprintf(yaml, sizeof yaml, "model: m\napi_key_file: %s\n", kf);
    const char *cf = tmp_file(yaml);
    rc = parse(&o, err, sizeof err, "--config", cf, NULL);
    CHECK(rc == 0 && o.n_api_key == 0 && str_eq(o.api_key_file, kf), "yaml key file: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "--api-key-file", "/nonexistent/keys", NULL);
    CHECK(rc < 0 && !strcmp(err, "api-key-file: /nonexistent/keys: cannot open: No such file or "
                                 "directory"), "%s", err);
    opts_free(&o);
    const char *empty = tmp_file("# no keys yet\n\n");
    rc = parse(&o, err, sizeof err, "m", "--api-key-file", empty, NULL);
    snprintf(want, sizeof want, "api-key-file: %s: no keys in the file", empty);
    CHECK(rc < 0 && !strcmp(err, want), "%s", err);
    opts_free(&o);
    /* bad lines: the error names the file and line, never the key */
    static const struct { const char *text, *why; } bad[] = {
        { "a sk-secret-1\nb sk-secret-1\n", ":2: the same key as line 1" },
        { "a sk-secret-1\na sk-secret-2\n", ":2: name 'a' already used on line 1" },
        { "bad/name sk-secret-1\n", ":1: invalid key name" },
        { "a sk-secret-1 rpm=0\n", ":1: rpm: must be an integer >= 1" },
        { "a sk-secret-1 tpm=x\n", ":1: tpm: must be an integer >= 1" },
        { "a sk-secret-1 sk-secret-2\n", ":1: unexpected field 11 characters long" },
        { "a sk-secret-1 rpm=1 rpm=2\n", ":1: rpm given twice" },
        { "a sk-secret-1 rpm=1 tpm=2 x=1\n", ":1: too many fields" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = tmp_file(bad[i].text);
        rc = parse(&o, err, sizeof err, "m", "--api-key-file", p, NULL);
        CHECK(rc < 0 && strstr(err, bad[i].why) && !strstr(err, "sk-secret"), "'%s': %s",
              bad[i].text, err);
        opts_free(&o);
    }
}

/* vLLM's -tp short form, the long flag, the YAML key and the range. */
static void test_tensor_parallel_flag(void)
{
    struct server_options o;
    char err[ERR_BUF];
    int rc = parse(&o, err, sizeof err, "m", "-tp", "4", NULL);
    CHECK(rc == 0 && o.tensor_parallel_size == 4, "-tp 4: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "--tensor-parallel-size=2", NULL);
    CHECK(rc == 0 && o.tensor_parallel_size == 2, "--tensor-parallel-size=2: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "--tensor-parallel-size", "9", NULL);
    CHECK(rc < 0 && strstr(err, "tensor-parallel-size") && strstr(err, "between 1 and 8"), "9: %s", err);
    opts_free(&o);
    rc = load_text("tensor-parallel-size: 2\n", &o, err, sizeof err);
    CHECK(rc == 0 && o.tensor_parallel_size == 2, "yaml: %d %s", rc, err);
    opts_free(&o);
}

/* vLLM's -q short form, the long flag, the YAML key and the choices; --dtype. */
static void test_quantization_flag(void)
{
    struct server_options o;
    char err[ERR_BUF];
    int rc = parse(&o, err, sizeof err, "m", NULL);
    CHECK(rc == 0 && str_eq(o.quantization, "none"), "default: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "-q", "q8_0", NULL);
    CHECK(rc == 0 && str_eq(o.quantization, "q8_0"), "-q q8_0: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "--quantization", "fp8", NULL);
    CHECK(rc < 0 && strstr(err, "quantization") && strstr(err, "none, q8_0"), "fp8: %s", err);
    opts_free(&o);
    rc = load_text("quantization: q8_0\n", &o, err, sizeof err);
    CHECK(rc == 0 && str_eq(o.quantization, "q8_0"), "yaml: %d %s", rc, err);
    opts_free(&o);
    /* vLLM's --dtype: the 16-bit types by their vLLM names; float32 is not offered */
    rc = parse(&o, err, sizeof err, "m", "--dtype", "bfloat16", NULL);
    CHECK(rc == 0 && str_eq(o.dtype, "bfloat16"), "--dtype bfloat16: %d %s", rc, err);
    opts_free(&o);
    rc = parse(&o, err, sizeof err, "m", "--dtype", "float32", NULL);
    CHECK(rc < 0 && strstr(err, "--dtype") && strstr(err, "half"), "float32: %s", err);
    opts_free(&o);
}

/* The key file parser itself: names, keys, limits, line numbers. */
static void test_keyfile(void)
{
    struct keyfile kf;
    char err[ERR_BUF];
    const char *p = tmp_file("# comment\n  team-a  sk-a  rpm=60 tpm=100000\nteam.b@x:y sk-b\n\n"
                             "sk-bare-key\n");
    int rc = keyfile_load(p, &kf, err, sizeof err);
    CHECK(rc == 0 && kf.n == 3, "%d %s", rc, err);
    if (rc == 0 && kf.n == 3) {
        CHECK(str_eq(kf.e[0].name, "team-a") && str_eq(kf.e[0].key, "sk-a") && kf.e[0].rpm == 60 &&
                  kf.e[0].tpm == 100000 && kf.e[0].line == 2, "entry 0");
        CHECK(str_eq(kf.e[1].name, "team.b@x:y") && kf.e[1].rpm == 0 && kf.e[1].tpm == 0, "entry 1");
        CHECK(str_eq(kf.e[2].name, "line-5") && str_eq(kf.e[2].key, "sk-bare-key"), "bare key");
    }
    keyfile_free(&kf);
    CHECK(kf.n == 0 && kf.e == NULL, "freed");
    char many[64 * 1100];
    size_t len = 0;
    for (int k = 0; k <= KEYFILE_MAX_KEYS; k++)
        len += (size_t)snprintf(many + len, sizeof many - len, "n%d k%d\n", k, k);
    rc = keyfile_load(tmp_file(many), &kf, err, sizeof err);
    CHECK(rc < 0 && strstr(err, "more than 1024 keys"), "%s", err);
}

/* opts_print_yaml of o, loaded back on top of the defaults, gives o again. */
static void round_trip(const struct server_options *o, const char *what)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    opts_print_yaml(o, f);
    fclose(f);
    struct server_options back;
    char msg[ERR_BUF];
    int rc = load_text(buf, &back, msg, sizeof msg);
    CHECK(rc == 0, "%s: reload failed: %s\n%s", what, msg, buf);
    check_same(&back, o, what);
    opts_free(&back);
    free(buf);
}

static void test_round_trip(void)
{
    struct server_options o;
    opts_defaults(&o);
    round_trip(&o, "defaults");
    opts_free(&o);
    fill_nondefault(&o);
    round_trip(&o, "non-default");
    opts_free(&o);
    fill_nondefault(&o);
    o.temperature = 1e-300;
    o.top_p = NAN;
    o.api_key_file = strdup("/etc/tessera/keys");
    round_trip(&o, "tiny/NaN");
    opts_free(&o);
}

static void test_print_config(void)
{
    char *argv[] = {"serve", "--print-config", "--port", "1234", NULL};
    struct server_options o;
    char err[ERR_BUF];
    /* no model needed to print; returns 1 and leaves nothing to free */
    int rc = parse_quiet(&o, err, sizeof err, 4, argv);
    CHECK(rc == 1 && o.host == NULL, "rc %d %s", rc, err);
    opts_free(&o);
    char *bad[] = {"serve", "--print-config", "--port", "0", NULL};
    rc = parse_quiet(&o, err, sizeof err, 4, bad);
    CHECK(rc < 0, "validation still runs");
    opts_free(&o);
}

/* Every key that opts_print_yaml writes appears at the start of a line of path as
 * "key:" (fmt = "\n%s:") or anywhere as "`key`" (fmt = "`%s`"). */
static void check_lists_every_key(const char *path, const char *fmt)
{
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *text = calloc(1, (size_t)n + 2);
    text[0] = '\n';
    CHECK(fread(text + 1, 1, (size_t)n, f) == (size_t)n, "read %s", path);
    fclose(f);
    struct server_options o;
    opts_defaults(&o);
    char *buf = NULL;
    size_t len = 0;
    FILE *y = open_memstream(&buf, &len);
    opts_print_yaml(&o, y);
    fclose(y);
    opts_free(&o);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        char *colon = strchr(line, ':');
        if (line[0] == '#' || !colon) continue;
        *colon = 0;
        char want[128];
        snprintf(want, sizeof want, fmt, line);
        CHECK(strstr(text, want) != NULL, "%s does not list '%s'", path, line);
    }
    free(buf);
    free(text);
}

static void test_example_config(void)
{
    const char *path = test_path("config/tessera.yaml");
    struct server_options o, want;
    char err[ERR_BUF];
    opts_defaults(&o);
    int rc = opts_load_yaml(&o, path, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    opts_defaults(&want);
    want.model = strdup("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    check_same(&o, &want, "config/tessera.yaml");
    opts_free(&o);
    opts_free(&want);
    check_lists_every_key(path, "\n%s:");
    check_lists_every_key(test_path("docs/configuration.md"), "`%s`");
}

int main(void)
{
    unsetenv("TESSERA_API_KEY");
    RUN(test_defaults);
    RUN(test_yaml_every_type);
    RUN(test_yaml_forms);
    RUN(test_yaml_errors);
    RUN(test_yaml_missing_file);
    RUN(test_flags_override_yaml);
    RUN(test_flag_forms);
    RUN(test_flag_errors);
    RUN(test_yaml_error_through_parse);
    RUN(test_help);
    RUN(test_positional_model);
    RUN(test_env_api_key);
    RUN(test_api_key_file);
    RUN(test_tensor_parallel_flag);
    RUN(test_quantization_flag);
    RUN(test_keyfile);
    RUN(test_round_trip);
    RUN(test_print_config);
    RUN(test_example_config);
    for (int i = 0; i < n_tmp && i < MAX_TMP; i++) unlink(tmp_paths[i]);
    return test_summary();
}
