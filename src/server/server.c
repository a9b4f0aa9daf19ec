/* server.c — start-up, the small endpoints, signals and the drain (see server.h).
 *
 * main thread: blocks SIGINT/SIGTERM/SIGHUP (every thread started later inherits the
 * mask) and starts the signal thread → starts the worker pool and HTTP (state LOADING:
 * /health 503) → loads the model, applies the chat-template override → starts the engine
 * (backend created, one warm-up step) → READY (sd_notify READY=1) → waits for the first
 * SIGTERM/SIGINT → DRAINING (STOPPING=1; new requests 503) → waits for requests still
 * being parsed, then for live requests, up to the grace period → stops HTTP (closing
 * streams aborts their requests) → frees the engine and the model.
 *
 * signal thread (sigwait): SIGHUP reloads the api-key-file; the first SIGTERM/SIGINT
 * during the model load exits at once (status 0: nothing was served), after it starts the
 * drain; a second one exits at once with 128 + the signal number.
 *
 * An engine failure (a backend fault) fails every live request at once, turns /health to
 * 503 and wakes the main thread as a stop would, which skips the drain and exits 1 for the
 * supervisor to restart the process (house style).
 */
#define _GNU_SOURCE
#include "server/server.h"
#include "api/response_store.h"
#include "backend/backend.h"
#include "config/keyfile.h"
#include "engine/speculative.h"
#include "engine/stats.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "server/background.h"
#include "server/notify.h"
#include "server/server_internal.h"
#include "template/jinja.h"
#include "util/err.h"
#include "util/log.h"
#include "util/mapfile.h"
#include "util/workq.h"
#include "version.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define METRICS_CAP (64 * 1024)  /* the engine's part of /metrics */
#define KEY_METRICS_BYTES 512    /* per API key name */
#define STORE_METRICS_BYTES 512  /* the Responses API store's gauges */
#define KEY_NAME_SLOT 24         /* "api-key-N" names of the --api-key keys */
#define MAX_PARSE_QUEUE 1024 /* requests waiting for a worker before new ones get 429 */

bool server_refuse_unless_ready(struct server *s, const struct http_request *req)
{
    int st = atomic_load(&s->state);
    if (st == SERVER_READY) return false;
    http_respond_error(req->conn, 503,
                       st == SERVER_LOADING ? "the model is still loading" : "the server is shutting down",
                       API_ERR_OVERLOADED, NULL, NULL, NULL);
    return true;
}

void server_respond_api_error(const struct http_request *req, const struct api_error *e)
{
    static const char *const retry[] = { "Retry-After: 1", NULL };
    http_respond_error(req->conn, e->status, e->message, e->type, e->param[0] ? e->param : NULL,
                       e->code, e->status == 429 ? retry : NULL);
}

void server_reply_api_error(struct http_reply *r, const struct api_error *e)
{
    static const char *const retry[] = { "Retry-After: 1", NULL };
    static const char oom[] =
        "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
    char *body = api_error_json(e);
    http_reply_send(r, body ? e->status : 500, "application/json", body ? body : oom, strlen(body ? body : oom),
                    body && e->status == 429 ? retry : NULL);
    free(body);
}

static void respond_json(const struct http_request *req, int status, char *body)
{
    if (!body) {
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
        return;
    }
    http_respond(req->conn, status, "application/json", body, strlen(body), NULL);
    free(body);
}

static void handle_health(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    if (engine_failed(s->e)) {
        http_respond_error(req->conn, 503, "the engine failed; the server is exiting", API_ERR_SERVER, NULL,
                           NULL, NULL);
        return;
    }
    http_respond(req->conn, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
}

static void handle_version(void *ud, const struct http_request *req)
{
    (void)ud;
    const char body[] = "{\"version\":\"" TESSERA_VERSION "\"}";
    http_respond(req->conn, 200, "application/json", body, sizeof body - 1, NULL);
}

static void handle_models(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    respond_json(req, 200, oai_models_json(s->names, s->n_names, s->started, s->o->model,
                                           s->ctx.max_model_len));
}

/* GET /v1/models/{name}: one served name's object, or 404 model_not_found. */
static void handle_model(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    const char *name = req->path + strlen("/v1/models/");
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(s->names[i], name)) {
            respond_json(req, 200, oai_model_json(name, s->started, s->o->model, s->ctx.max_model_len));
            return;
        }
    char msg[320];
    snprintf(msg, sizeof msg, "The model '%.256s' does not exist.", name);
    http_respond_error(req->conn, 404, msg, API_ERR_INVALID_REQUEST, "model", "model_not_found", NULL);
}

/* Per-API-key counters, labelled with the key's name (never the key). Names are
 * restricted to characters that need no escaping in a label value. */
static size_t format_key_metrics(struct server *s, char *buf, size_t cap)
{
    static const struct { const char *name, *help; } fam[] = {
        { "tessera:api_key_requests_total", "Authenticated requests per API key name." },
        { "tessera:api_key_rate_limited_total", "Requests refused with 429 by a key's limit." },
        { "tessera:api_key_prompt_tokens_total", "Prompt tokens of finished requests per key." },
        { "tessera:api_key_generation_tokens_total", "Generated tokens per key." },
    };
    int n = http_server_key_stats(s->http, NULL, 0);
    struct http_key_stats *ks = calloc((size_t)(n > 0 ? n : 1), sizeof *ks);
    if (!ks) return 0;
    int got = http_server_key_stats(s->http, ks, n);
    if (got < n) n = got;
    size_t len = 0;
#define OUT(...)                                                                     \
    do {                                                                             \
        if (len < cap) len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__);   \
    } while (0)
    for (int f = 0; f < 4 && n > 0; f++) {
        OUT("# HELP %s %s\n# TYPE %s counter\n", fam[f].name, fam[f].help, fam[f].name);
        for (int i = 0; i < n; i++) {
            const struct http_key_stats *k = &ks[i];
            if (f == 1) {
                OUT("%s{key_name=\"%s\",limit=\"rpm\"} %llu\n", fam[f].name, k->name,
                    (unsigned long long)k->rate_limited_rpm);
                OUT("%s{key_name=\"%s\",limit=\"tpm\"} %llu\n", fam[f].name, k->name,
                    (unsigned long long)k->rate_limited_tpm);
                continue;
            }
            unsigned long long v = f == 0 ? k->requests : f == 2 ? k->prompt_tokens
                                                                 : k->completion_tokens;
            OUT("%s{key_name=\"%s\"} %llu\n", fam[f].name, k->name, v);
        }
    }
#undef OUT
    free(ks);
    return len < cap ? len : cap;
}

/* The Responses API store's gauges (none when the server keeps no responses). */
static size_t format_store_metrics(struct server *s, char *buf, size_t cap)
{
    if (!s->ctx.responses) return 0;
    int n;
    size_t bytes;
    resp_store_usage(s->ctx.responses, &n, &bytes);
    int len = snprintf(buf, cap,
                       "# HELP tessera:responses_stored Responses kept for previous_response_id and "
                       "GET /v1/responses/{id}.\n# TYPE tessera:responses_stored gauge\n"
                       "tessera:responses_stored %d\n"
                       "# HELP tessera:responses_stored_bytes Memory they take, of --response-store-mb.\n"
                       "# TYPE tessera:responses_stored_bytes gauge\ntessera:responses_stored_bytes %zu\n"
                       "# HELP tessera:responses_background_running Background responses still running.\n"
                       "# TYPE tessera:responses_background_running gauge\n"
                       "tessera:responses_background_running %d\n",
                       n, bytes, bg_running(s->bg));
    return len > 0 ? (size_t)len : 0;
}

static void handle_metrics(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    struct engine_stats st;
    engine_get_stats(s->e, &st);
    size_t cap = METRICS_CAP + STORE_METRICS_BYTES + (size_t)http_server_key_stats(s->http, NULL, 0) * KEY_METRICS_BYTES;
    char *buf = malloc(cap);
    if (!buf) {
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
        return;
    }
    size_t n = stats_format_prometheus(&st, s->names[0], buf, METRICS_CAP);
    if (n >= METRICS_CAP) n = METRICS_CAP - 1;
    n += format_store_metrics(s, buf + n, cap - n);
    if (n >= cap) n = cap - 1;
    n += format_key_metrics(s, buf + n, cap - n);
    if (n >= cap) n = cap - 1;
    http_respond(req->conn, 200, "text/plain; version=0.0.4; charset=utf-8", buf, n, NULL);
    free(buf);
}

/* /tokenize and /detokenize run on a worker: a long prompt takes a while to tokenize. */
struct tok_task {
    struct server *s;
    struct http_reply *reply;
    char *body;
    size_t len;
    bool decode;
};

static void tok_run(void *arg)
{
    struct tok_task *t = arg;
    char *out = NULL;
    struct api_error e;
    const char *body = t->body ? t->body : "";
    int rc = t->decode ? oai_detokenize(&t->s->ctx, body, t->len, &out, &e)
                       : oai_tokenize(&t->s->ctx, body, t->len, &out, &e);
    if (rc) {
        char *body = api_error_json(&e);
        if (body) http_reply_send(t->reply, e.status, "application/json", body, strlen(body), NULL);
        else http_reply_send(t->reply, 500, "text/plain", "out of memory", 13, NULL);
        free(body);
    } else {
        http_reply_send(t->reply, 200, "application/json", out, strlen(out), NULL);
    }
    free(out);
    free(t->body);
    free(t);
}

static void handle_tokenize(void *ud, const struct http_request *req, bool decode)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    struct tok_task *t = calloc(1, sizeof *t);
    if (!t || !(t->reply = http_reply_defer(req->conn, false, NULL, NULL))) {
        free(t); /* the HTTP layer answers 500 */
        return;
    }
    t->s = s;
    t->decode = decode;
    t->body = http_take_body(req->conn, &t->len);
    if (!server_work(s, tok_run, t)) {
        static const char *const retry[] = { "Retry-After: 1", NULL };
        char *body = api_error_json_fields("too many requests are waiting to be parsed; retry later",
                                           API_ERR_RATE_LIMIT, NULL, "rate_limit_exceeded");
        http_reply_send(t->reply, 429, "application/json", body ? body : "", body ? strlen(body) : 0,
                        retry);
        free(body);
        free(t->body);
        free(t);
    }
}
static void handle_tok(void *ud, const struct http_request *req) { handle_tokenize(ud, req, false); }
static void handle_detok(void *ud, const struct http_request *req) { handle_tokenize(ud, req, true); }

struct work {
    struct server *s;
    void (*fn)(void *);
    void *arg;
};

static void work_run(void *arg)
{
    struct work w = *(struct work *)arg;
    free(arg);
    w.fn(w.arg);
    atomic_fetch_sub(&w.s->n_tasks, 1);
}

bool server_work(struct server *s, void (*fn)(void *), void *arg)
{
    struct work *w = malloc(sizeof *w);
    if (!w) return false;
    *w = (struct work){ s, fn, arg };
    atomic_fetch_add(&s->n_tasks, 1);
    if (workq_push(s->workers, work_run, w)) return true;
    atomic_fetch_sub(&s->n_tasks, 1);
    free(w);
    return false;
}

/* The engine's configuration from the options and the model. The backend sizes its KV
 * cache (and says what is missing when one max-model-len sequence does not fit). */
static int engine_config_from(const struct server_options *o, const struct model *m,
                              struct engine_config *ec, char *err, size_t errlen)
{
    memset(ec, 0, sizeof *ec);
    struct sched_config *c = &ec->sched;
    sched_config_default(c);
    int model_len = m->cfg.max_seq_len;
    c->max_model_len = o->max_model_len > 0 ? o->max_model_len : (model_len < 8192 ? model_len : 8192);
    if (c->max_model_len > model_len)
        return err_set(err, errlen, ERR_RANGE, "--max-model-len %d exceeds the model's context length %d",
                       c->max_model_len, model_len);
    c->policy = !strcmp(o->scheduling_policy, "priority") ? SCHED_PRIORITY : SCHED_FCFS;
    c->max_num_seqs = o->max_num_seqs;
    c->block_size = o->block_size;
    c->enable_prefix_caching = o->enable_prefix_caching;
    c->enable_chunked_prefill = o->enable_chunked_prefill;
    c->max_num_batched_tokens = o->max_num_batched_tokens > 0 ? o->max_num_batched_tokens : 2048;
    if (!c->enable_chunked_prefill && c->max_num_batched_tokens < c->max_model_len) {
        if (o->max_num_batched_tokens > 0)
            return err_set(err, errlen, ERR_INVALID,
                           "--max-num-batched-tokens %d must be >= --max-model-len %d without chunked prefill",
                           o->max_num_batched_tokens, c->max_model_len);
        c->max_num_batched_tokens = c->max_model_len;
    }
    struct backend_config *b = &c->backend;
    /* the option table admits only valid names: these cannot fail */
    backend_device_parse(o->device, &b->device);
    b->kv_dtype_auto = !strcmp(o->kv_cache_dtype, "auto");
    if (!b->kv_dtype_auto) kv_dtype_parse(o->kv_cache_dtype, &b->kv_dtype);
    b->cpu_kv_bytes = (size_t)(o->kv_cache_memory > 0 ? o->kv_cache_memory : 1024) << 20;
    b->gpu_memory_utilization = o->gpu_memory_utilization;
    b->n_threads = o->threads;
    b->enforce_eager = o->enforce_eager;
    b->tensor_parallel_size = o->tensor_parallel_size;
    /* checked by opts_parse; a caller that filled the options itself gets the message */
    int rc = spec_config_parse(o->speculative_config, &c->spec, err, errlen);
    if (rc) return rc;
    ec->max_queued_requests = o->max_queued_requests;
    ec->max_queued_tokens = o->max_queued_tokens;
    return 0;
}

/* Engine failure (scheduler thread): wake the main thread as a stop signal would; it sees
 * engine_failed() and exits non-zero without a drain. */
static void on_engine_failure(void *ud, const char *reason)
{
    struct server *s = ud;
    LOG_ERR("server", "engine failed (%s): exiting", reason);
    pthread_mutex_lock(&s->mu);
    if (!s->stop_signal) s->stop_signal = SIGTERM;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Sampling defaults: generation_config.json, then the server flags. */
static void defaults_from(const struct server_options *o, const struct model *m,
                          struct oai_defaults *d)
{
    sampler_params_default(&d->sp);
    if (m->gen.temperature >= 0) d->sp.temperature = (float)m->gen.temperature;
    if (m->gen.top_p >= 0) d->sp.top_p = (float)m->gen.top_p;
    if (m->gen.top_k >= 0) d->sp.top_k = m->gen.top_k;
    if (m->gen.repetition_penalty > 0) d->sp.repetition_penalty = (float)m->gen.repetition_penalty;
    if (!isnan(o->temperature)) d->sp.temperature = (float)o->temperature;
    if (!isnan(o->top_p)) d->sp.top_p = (float)o->top_p;
    if (o->top_k >= 0) d->sp.top_k = o->top_k;
    if (!isnan(o->min_p)) d->sp.min_p = (float)o->min_p;
    if (!isnan(o->repetition_penalty)) d->sp.repetition_penalty = (float)o->repetition_penalty;
    d->max_tokens = o->max_tokens;
}

static int load_template_override(struct model *m, const char *path, char *err, size_t errlen)
{
    char *src = NULL;
    size_t len = 0;
    struct jinja_template *t = NULL;
    int rc = read_text_file(path, &src, &len, err, errlen);
    if (!rc) rc = jinja_parse(src, len, &t, err, errlen);
    free(src);
    if (rc) return rc;
    jinja_free(m->tmpl);
    m->tmpl = t;
    return 0;
}

static void set_names(struct server *s)
{
    const struct server_options *o = s->o;
    for (int i = 0; i < o->n_served_model_name; i++) s->names[s->n_names++] = o->served_model_name[i];
    if (s->n_names == 0) {
        /* the path's last component, without a trailing '/' or a .gguf suffix */
        const char *p = o->model;
        size_t len = strlen(p);
        while (len > 1 && p[len - 1] == '/') len--;
        const char *b = p + len;
        while (b > p && b[-1] != '/') b--;
        size_t n = (size_t)(p + len - b);
        if (n > 5 && !strncmp(b + n - 5, ".gguf", 5)) n -= 5; /* "x.gguf" is served as "x" */
        snprintf(s->default_name, sizeof s->default_name, "%.*s", (int)n, b);
        s->names[s->n_names++] = s->default_name;
    }
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- API keys -------------------------------------------------------------------------- */

/* The key set: api-key (flags / file / TESSERA_API_KEY) named api-key-1, api-key-2, ...
 * in that order, then the api-key-file's named keys (a key given both ways keeps the
 * file's name and limits). Returns 0 and a malloc'd array (free with keys_free), or an
 * error naming the file and line. */
static int keys_build(const struct server_options *o, struct http_key **out, int *n_out,
                      struct keyfile *kf, char *names, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    memset(kf, 0, sizeof *kf);
    if (o->api_key_file) {
        int rc = keyfile_load(o->api_key_file, kf, err, errlen);
        if (rc) return rc;
    }
    struct http_key *k = calloc((size_t)(o->n_api_key + kf->n + 1), sizeof *k);
    if (!k) {
        keyfile_free(kf);
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    }
    int n = 0;
    for (int i = 0; i < o->n_api_key; i++) {
        bool in_file = false;
        for (int f = 0; f < kf->n && !in_file; f++) in_file = !strcmp(kf->e[f].key, o->api_key[i]);
        if (in_file) continue;
        char *name = names + (size_t)i * KEY_NAME_SLOT;
        snprintf(name, KEY_NAME_SLOT, "api-key-%d", i + 1);
        k[n++] = (struct http_key){ .name = name, .key = o->api_key[i] };
    }
    for (int f = 0; f < kf->n; f++)
        k[n++] = (struct http_key){ .name = kf->e[f].name, .key = kf->e[f].key,
                                    .rpm = kf->e[f].rpm, .tpm = kf->e[f].tpm };
    *out = k;
    *n_out = n;
    return 0;
}

/* (Re)loads the key set into the HTTP server. On error the keys in force stay. */
static int keys_apply(struct server *s, char *err, size_t errlen)
{
    struct http_key *keys;
    struct keyfile kf;
    char names[OPTS_MAX_LIST * KEY_NAME_SLOT];
    int n, rc = keys_build(s->o, &keys, &n, &kf, names, err, errlen);
    if (rc) return rc;
    rc = http_server_set_keys(s->http, keys, n, err, errlen);
    free(keys);
    keyfile_free(&kf);
    if (!rc) LOG_INFO("server", "%d API key%s in force%s", n, n == 1 ? "" : "s",
                      n ? "" : ": no authentication");
    return rc;
}

/* ---- signals ------------------------------------------------------------------------- */

/* The signals the signal thread takes with sigwait (blocked in every thread): SIGINT and
 * SIGTERM stop, SIGHUP reloads the key file, SIGUSR1 ends the thread at shutdown (a
 * cancelled sigwait would do, but unwinding a cancelled thread confuses ASan). */
static void server_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    sigaddset(sigs, SIGHUP);
    sigaddset(sigs, SIGUSR1);
}

static void *signal_main(void *arg)
{
    struct server *s = arg;
    sigset_t sigs;
    server_signals(&sigs);
    for (;;) {
        int sig = 0;
        if (sigwait(&sigs, &sig) != 0) continue;
        if (sig == SIGUSR1) { /* server_run ends this thread with it (pthread_kill) at its end */
            pthread_mutex_lock(&s->mu);
            bool end = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (end) return NULL;
            continue; /* from outside: ignored */
        }
        if (sig == SIGHUP) {
            char err[ERR_BUF];
            pthread_mutex_lock(&s->mu);
            if (!s->o->api_key_file)
                LOG_INFO("server", "SIGHUP: no api-key-file to reload");
            else if (atomic_load(&s->state) == SERVER_LOADING || s->stopping)
                LOG_WARN("server", "SIGHUP while starting or stopping: keys not reloaded");
            else if (keys_apply(s, err, sizeof err))
                LOG_ERR("server", "SIGHUP: keeping the previous API keys: %s", err);
            else
                LOG_INFO("server", "SIGHUP: reloaded %s", s->o->api_key_file);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        bool tearing_down = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (atomic_load(&s->state) == SERVER_LOADING && !tearing_down) {
            /* nothing is served yet: stop the load by ending the process */
            LOG_WARN("server", "signal %d during start-up: stopping", sig);
            notify_stopping("stopped during start-up");
            _exit(0);
        }
        pthread_mutex_lock(&s->mu);
        bool first = s->stop_signal == 0;
        if (first) s->stop_signal = sig;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (!first) {
            LOG_WARN("server", "second signal %d: exiting now, without finishing the drain", sig);
            _exit(128 + sig);
        }
    }
    return NULL;
}

/* Waits up to timeout_s for done(s) (polled every 10 ms). */
static bool wait_for(struct server *s, bool (*done)(struct server *), double timeout_s)
{
    double deadline = now_s() + timeout_s;
    while (!done(s)) {
        if (now_s() >= deadline) return false;
        usleep(10 * 1000);
    }
    return true;
}

static bool parsing_done(struct server *s) { return atomic_load(&s->n_tasks) == 0; }
static bool engine_idle(struct server *s) { return engine_num_active(s->e) == 0; }

int server_run(const struct server_options *o)
{
    sigset_t sigs;
    server_signals(&sigs);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct server s = { .o = o, .started = (int64_t)time(NULL) };
    atomic_init(&s.state, SERVER_LOADING);
    atomic_init(&s.n_tasks, 0);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    set_names(&s);
    pthread_t sig_thread;
    if (pthread_create(&sig_thread, NULL, signal_main, &s) != 0) {
        LOG_ERR("server", "cannot start the signal thread");
        return 1;
    }

    const struct http_route routes[] = {
        { "POST", "/v1/chat/completions", server_handle_chat, &s, HTTP_ROUTE_METERED },
        { "POST", "/v1/completions", server_handle_completion, &s, HTTP_ROUTE_METERED },
        { "POST", "/v1/responses", server_handle_responses, &s, HTTP_ROUTE_METERED },
        { "GET", "/v1/responses", server_handle_get_response, &s, HTTP_ROUTE_SUBPATHS },
        { "DELETE", "/v1/responses", server_handle_delete_response, &s, HTTP_ROUTE_SUBPATHS },
        { "POST", "/v1/responses", server_handle_response_action, &s, HTTP_ROUTE_SUBPATHS },
        { "GET", "/v1/models", handle_models, &s, 0 },
        { "GET", "/v1/models", handle_model, &s, HTTP_ROUTE_SUBPATHS },
        { "GET", "/health", handle_health, &s, HTTP_ROUTE_PUBLIC },
        { "GET", "/metrics", handle_metrics, &s, o->public_metrics ? HTTP_ROUTE_PUBLIC : 0 },
        { "POST", "/tokenize", handle_tok, &s, 0 },
        { "POST", "/detokenize", handle_detok, &s, 0 },
        { "GET", "/version", handle_version, &s, HTTP_ROUTE_PUBLIC },
    };
    struct http_config hc;
    http_config_default(&hc);
    hc.host = o->host;
    hc.port = o->port;
    hc.max_body_bytes = (size_t)o->max_body_bytes;
    hc.max_header_bytes = (size_t)o->max_header_bytes;
    hc.max_connections = o->max_connections;
    hc.max_connections_per_ip = o->max_connections_per_ip;
    hc.max_stream_queue_bytes = (size_t)o->max_stream_queue_bytes;
    hc.timeout_s = o->http_timeout;
    hc.keepalive_s = o->keepalive_interval;
    hc.n_threads = o->http_threads;
    hc.cors = (struct http_cors){
        .origins = (const char *const *)o->allowed_origins, .n_origins = o->n_allowed_origins,
        .methods = (const char *const *)o->allowed_methods, .n_methods = o->n_allowed_methods,
        .headers = (const char *const *)o->allowed_headers, .n_headers = o->n_allowed_headers,
        .credentials = o->allow_credentials,
    };

    char err[ERR_BUF];
    struct http_server *http = NULL;
    int status = 1;
    struct engine_config ec;
    struct grammar_vocab *gv = NULL;
    struct resp_store *responses = NULL; /* freed after the engine: finishing requests store into it */
    s.workers = workq_create(o->api_threads, MAX_PARSE_QUEUE);
    if (!s.workers) {
        snprintf(err, sizeof err, "cannot start %d API worker threads", o->api_threads);
        goto fail;
    }
    /* keys before the first request can arrive: start HTTP with them */
    {
        struct http_key *keys;
        struct keyfile kf;
        char names[OPTS_MAX_LIST * KEY_NAME_SLOT];
        int n;
        if (keys_build(o, &keys, &n, &kf, names, err, sizeof err)) goto fail;
        hc.keys = keys;
        hc.n_keys = n;
        int rc = http_server_start(&http, &hc, routes, (int)(sizeof routes / sizeof routes[0]),
                                   err, sizeof err);
        free(keys);
        keyfile_free(&kf);
        if (rc) goto fail;
        LOG_INFO("server", "%d API key%s in force%s", n, n == 1 ? "" : "s",
                 n ? "" : ": no authentication");
    }
    s.http = http;
    LOG_INFO("server", "listening on http://%s:%d (loading %s)", o->host, http_server_port(http),
             o->model);
    notify_status("loading %s", o->model);

    double t0 = now_s();
    unsigned load_flags = !strcmp(o->load_format, "dummy") ? MODEL_LOAD_DUMMY : 0;
    model_convert_flags(o->quantization, o->dtype, &load_flags); /* names checked by the option table */
    if (model_load(o->model, load_flags, &s.m, err, sizeof err))
        goto fail;
    if (o->chat_template && load_template_override(s.m, o->chat_template, err, sizeof err)) goto fail;
    if (engine_config_from(o, s.m, &ec, err, sizeof err)) goto fail;
    ec.on_failure = on_engine_failure;
    ec.failure_ud = &s;
    double wd = notify_watchdog_interval();
    if (wd > 0) { /* systemd WatchdogSec: pinged from the scheduler loop */
        ec.tick = notify_watchdog;
        ec.tick_interval_s = wd;
    }
    if (engine_create(&s.e, s.m, &ec, err, sizeof err)) goto fail;
    s.ctx = (struct oai_ctx){ .m = s.m, .served_names = s.names, .n_served = s.n_names,
                              .max_model_len = engine_sched_config(s.e)->max_model_len,
                              .max_logprobs = o->max_logprobs };
    s.ctx.max_prompt_bytes = oai_max_prompt_bytes(s.m, s.ctx.max_model_len);
    s.ctx.priority_scheduling = ec.sched.policy == SCHED_PRIORITY;
    if (o->response_store_mb > 0 && (!(responses = resp_store_create((size_t)o->response_store_mb << 20)) ||
                                     !(s.bg = bg_create(responses)))) {
        snprintf(err, sizeof err, "out of memory creating the response store");
        goto fail;
    }
    s.ctx.responses = responses;
    defaults_from(o, s.m, &s.ctx.defaults);
    /* structured output: the vocabulary as text, built once and shared by every request's
       grammar (so it outlives them: freed after the engine and HTTP) */
    if (grammar_vocab_create(&gv, s.m->tok, s.m->eog_ids, s.m->n_eog, err, sizeof err) == 0 &&
        grammar_vocab_size(gv) > s.m->cfg.vocab_size) {
        snprintf(err, sizeof err, "the tokenizer has %d tokens, more than the model's %d logits",
                 grammar_vocab_size(gv), s.m->cfg.vocab_size);
        grammar_vocab_free(gv);
        gv = NULL;
    }
    if (!gv) LOG_WARN("server", "structured output is off: %s", err);
    s.ctx.gv = gv;
    /* chat output parsing: the named tool-call format, or the one the template shows */
    s.ctx.tool_format = !strcmp(o->tool_call_parser, "auto")
                            ? tparse_format_detect(s.m->chat_template)
                            : (enum tparse_format)tparse_format_from_name(o->tool_call_parser);
    s.ctx.reasoning = (enum rsn_kind)rsn_kind_from_name(o->reasoning_parser);
    LOG_INFO("server", "tool-call parser %s%s, reasoning parser %s",
             tparse_format_name(s.ctx.tool_format),
             !strcmp(o->tool_call_parser, "auto") ? " (from the chat template)" : "",
             rsn_kind_name(s.ctx.reasoning));
    char desc[MODEL_DESC_MAX];
    model_describe(s.m, desc, sizeof desc);
    LOG_INFO("server", "model %s loaded in %.1f s: %s", s.names[0], now_s() - t0, desc);
    const struct sched_config *sc = engine_sched_config(s.e);
    const struct backend_info *bi = engine_backend_info(s.e);
    LOG_INFO("server", "backend %s (%s)%s%s: weights %.1f MiB, KV cache %.1f MiB (%s), activations %.1f MiB%s",
             bi->name, bi->device, bi->fallback[0] ? ", device auto fell back: " : "", bi->fallback,
             (double)bi->weight_bytes / 1048576.0, (double)bi->kv_bytes / 1048576.0, kv_dtype_name(bi->kv_dtype),
             (double)bi->activation_bytes / 1048576.0,
             !strcmp(bi->name, "cuda") ? (bi->graphs ? ", CUDA graphs" : ", eager") : "");
    if (!strcmp(bi->name, "cuda")) { /* the GPUs hold the weights; nothing on the host reads them again */
        const size_t freed = model_release_converted(s.m);
        if (freed)
            LOG_INFO("server", "released the host copy of the weights converted at load (%.1f MiB): the GPU "
                     "holds them", (double)freed / 1048576.0);
    } else { /* the CPU backend reads its packed copy of every matrix but the embedding */
        const size_t freed = model_release_converted_packed(s.m);
        if (freed)
            LOG_INFO("server", "released %.1f MiB of the weights converted at load: the CPU backend reads its "
                     "packed copy", (double)freed / 1048576.0);
    }
    /* vLLM's lines, so the same log checks work */
    LOG_INFO("server", "# %s blocks: %d, maximum concurrency for %d tokens per request: %.2fx",
             !strcmp(bi->name, "cuda") ? "GPU" : "CPU", bi->num_blocks, sc->max_model_len,
             (double)bi->num_blocks * bi->block_size / (double)sc->max_model_len);
    char spec[96];
    spec_config_describe(&sc->spec, spec, sizeof spec);
    LOG_INFO("server", "engine: max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
             "%d KV blocks of %d tokens, %s scheduling, prefix caching %s, chunked prefill %s, overlapped "
             "scheduling %s, speculative decoding %s",
             sc->max_model_len, sc->max_num_seqs, sc->max_num_batched_tokens, bi->num_blocks, bi->block_size,
             sc->policy == SCHED_PRIORITY ? "priority" : "fcfs",
             sc->enable_prefix_caching ? "on" : "off", sc->enable_chunked_prefill ? "on" : "off",
             sc->overlap == SCHED_OVERLAP_ON ? "on" : "off", spec);
    atomic_store(&s.state, SERVER_READY);
    LOG_INFO("server", "ready");
    notify_ready("ready");

    pthread_mutex_lock(&s.mu);
    while (!s.stop_signal) pthread_cond_wait(&s.cv, &s.mu);
    int sig = s.stop_signal;
    pthread_mutex_unlock(&s.mu);
    if (engine_failed(s.e)) { /* every request has its error already; nothing to drain */
        atomic_store(&s.state, SERVER_DRAINING);
        notify_stopping("engine failed");
        http_server_wait_idle(http, 2.0);
        LOG_ERR("server", "exiting after an engine failure");
        goto done;
    }
    LOG_INFO("server", "signal %d: draining %d live requests", sig,
             engine_num_active(s.e) + atomic_load(&s.n_tasks));
    atomic_store(&s.state, SERVER_DRAINING);
    notify_stopping("draining");
    double deadline = now_s() + o->drain_timeout;
    /* requests that arrived before the signal but are still being parsed get to start */
    wait_for(&s, parsing_done, o->drain_timeout);
    engine_drain(s.e);
    double left = deadline - now_s();
    if (!wait_for(&s, engine_idle, left > 0 ? left : 0)) {
        /* abort while the connections are still open, so each stream gets its error
           event and [DONE] before HTTP stops */
        LOG_WARN("server", "drain timeout: aborting %d requests", engine_num_active(s.e));
        engine_abort_all(s.e);
        wait_for(&s, engine_idle, 5.0);
    }
    http_server_wait_idle(http, 2.0);
    status = 0;
    goto done;
fail:
    LOG_ERR("server", "%s", err);
done:
    pthread_mutex_lock(&s.mu);
    s.stopping = true; /* no more key reloads: HTTP goes away */
    pthread_mutex_unlock(&s.mu);
    /* HTTP first: closing the connections aborts what is still running; the engine then
       sends each request its final notify while the deferred replies are still valid.
       The workers run what is still queued (their replies are closed by then). */
    http_server_stop(http);
    workq_free(s.workers);
    engine_free(s.e);
    if (gv) grammar_vocab_free(gv);
    bg_free(s.bg); /* empty: every background job ended with the engine */
    resp_store_free(responses);
    model_free(s.m);
    pthread_kill(sig_thread, SIGUSR1); /* s.stopping is set: the thread returns */
    pthread_join(sig_thread, NULL);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    LOG_INFO("server", "stopped");
    return status;
}
