/* server.c — start-up, the small endpoints, signals and the drain (see server.h).
 *
 * main thread: blocks SIGINT/SIGTERM (every thread started later inherits the mask) →
 * starts HTTP (state LOADING: /health 503) → loads the model, applies the chat-template
 * override → starts the engine (backend created, one warm-up step) → READY → sigwait →
 * DRAINING (new requests 503) → waits for live requests up to the grace period → stops
 * HTTP (closing streams aborts their requests) → frees the engine and the model.
 * An engine failure (a backend fault) fails every live request at once, turns /health to
 * 503 and raises SIGTERM, so the main thread wakes, skips the drain and exits 1 for the
 * supervisor to restart the process (house style).
 */
#define _GNU_SOURCE
#include "server/server.h"
#include "backend/backend.h"
#include "engine/stats.h"
#include "model/model.h"
#include "server/server_internal.h"
#include "template/jinja.h"
#include "util/err.h"
#include "util/log.h"
#include "util/mapfile.h"
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

#define METRICS_CAP (64 * 1024)

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

static void handle_metrics(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    struct engine_stats st;
    engine_get_stats(s->e, &st);
    char *buf = malloc(METRICS_CAP);
    if (!buf) {
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
        return;
    }
    size_t n = stats_format_prometheus(&st, s->names[0], buf, METRICS_CAP);
    if (n >= METRICS_CAP) n = METRICS_CAP - 1;
    http_respond(req->conn, 200, "text/plain; version=0.0.4; charset=utf-8", buf, n, NULL);
    free(buf);
}

static void handle_tokenize(void *ud, const struct http_request *req, bool decode)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    char *out = NULL;
    struct api_error e;
    int rc = decode ? oai_detokenize(&s->ctx, req->body, req->body_len, &out, &e)
                    : oai_tokenize(&s->ctx, req->body, req->body_len, &out, &e);
    if (rc) server_respond_api_error(req, &e);
    else respond_json(req, 200, out);
}
static void handle_tok(void *ud, const struct http_request *req) { handle_tokenize(ud, req, false); }
static void handle_detok(void *ud, const struct http_request *req) { handle_tokenize(ud, req, true); }

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
    ec->max_queued_requests = o->max_queued_requests;
    ec->max_queued_tokens = o->max_queued_tokens;
    return 0;
}

/* Engine failure (scheduler thread): wake the main thread, which exits non-zero. */
static void on_engine_failure(void *ud, const char *reason)
{
    (void)ud;
    LOG_ERR("server", "engine failed (%s): exiting", reason);
    kill(getpid(), SIGTERM);
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

int server_run(const struct server_options *o)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct server s = { .o = o, .started = (int64_t)time(NULL) };
    atomic_init(&s.state, SERVER_LOADING);
    set_names(&s);

    const struct http_route routes[] = {
        { "POST", "/v1/chat/completions", server_handle_chat, &s, 0 },
        { "POST", "/v1/completions", server_handle_completion, &s, 0 },
        { "GET", "/v1/models", handle_models, &s, 0 },
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
    hc.api_keys = (const char *const *)o->api_key;
    hc.n_api_keys = o->n_api_key;
    hc.max_body_bytes = (size_t)o->max_body_bytes;
    hc.max_header_bytes = (size_t)o->max_header_bytes;
    hc.max_connections = o->max_connections;
    hc.max_connections_per_ip = o->max_connections_per_ip;
    hc.timeout_s = o->http_timeout;
    hc.keepalive_s = o->keepalive_interval;
    hc.n_threads = o->http_threads;

    char err[ERR_BUF];
    struct http_server *http = NULL;
    int status = 1;
    if (http_server_start(&http, &hc, routes, (int)(sizeof routes / sizeof routes[0]), err,
                          sizeof err)) {
        LOG_ERR("server", "%s", err);
        return 1;
    }
    LOG_INFO("server", "listening on http://%s:%d (loading %s)", o->host, http_server_port(http),
             o->model);

    struct engine_config ec;
    double t0 = now_s();
    if (model_load(o->model, !strcmp(o->load_format, "dummy") ? MODEL_LOAD_DUMMY : 0, &s.m, err, sizeof err))
        goto fail;
    if (o->chat_template && load_template_override(s.m, o->chat_template, err, sizeof err)) goto fail;
    if (engine_config_from(o, s.m, &ec, err, sizeof err)) goto fail;
    ec.on_failure = on_engine_failure;
    if (engine_create(&s.e, s.m, &ec, err, sizeof err)) goto fail;
    s.ctx = (struct oai_ctx){ .m = s.m, .served_names = s.names, .n_served = s.n_names,
                              .max_model_len = engine_sched_config(s.e)->max_model_len };
    defaults_from(o, s.m, &s.ctx.defaults);
    char desc[256];
    model_describe(s.m, desc, sizeof desc);
    LOG_INFO("server", "model %s loaded in %.1f s: %s", s.names[0], now_s() - t0, desc);
    const struct sched_config *sc = engine_sched_config(s.e);
    const struct backend_info *bi = engine_backend_info(s.e);
    LOG_INFO("server", "backend %s (%s)%s%s: weights %.1f MiB, KV cache %.1f MiB (%s), activations %.1f MiB%s",
             bi->name, bi->device, bi->fallback[0] ? ", device auto fell back: " : "", bi->fallback,
             (double)bi->weight_bytes / 1048576.0, (double)bi->kv_bytes / 1048576.0, kv_dtype_name(bi->kv_dtype),
             (double)bi->activation_bytes / 1048576.0,
             !strcmp(bi->name, "cuda") ? (bi->graphs ? ", CUDA graphs" : ", eager") : "");
    /* vLLM's lines, so the same log checks work */
    LOG_INFO("server", "# %s blocks: %d, maximum concurrency for %d tokens per request: %.2fx",
             !strcmp(bi->name, "cuda") ? "GPU" : "CPU", bi->num_blocks, sc->max_model_len,
             (double)bi->num_blocks * bi->block_size / (double)sc->max_model_len);
    LOG_INFO("server", "engine: max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d, "
             "%d KV blocks of %d tokens, prefix caching %s, chunked prefill %s, overlapped scheduling %s",
             sc->max_model_len, sc->max_num_seqs, sc->max_num_batched_tokens, bi->num_blocks, bi->block_size,
             sc->enable_prefix_caching ? "on" : "off", sc->enable_chunked_prefill ? "on" : "off",
             sc->overlap == SCHED_OVERLAP_ON ? "on" : "off");
    atomic_store(&s.state, SERVER_READY);
    LOG_INFO("server", "ready");

    int sig = 0;
    sigwait(&sigs, &sig);
    if (engine_failed(s.e)) { /* every request has its error already; nothing to drain */
        atomic_store(&s.state, SERVER_DRAINING);
        http_server_wait_idle(http, 2.0);
        LOG_ERR("server", "exiting after an engine failure");
        goto done;
    }
    LOG_INFO("server", "signal %d: draining %d live requests", sig, engine_num_active(s.e));
    atomic_store(&s.state, SERVER_DRAINING);
    engine_drain(s.e);
    double deadline = now_s() + o->drain_timeout;
    while (engine_num_active(s.e) > 0 && now_s() < deadline) usleep(20 * 1000);
    if (engine_num_active(s.e) > 0) {
        /* abort while the connections are still open, so each stream gets its error
           event and [DONE] before HTTP stops */
        LOG_WARN("server", "drain timeout: aborting %d requests", engine_num_active(s.e));
        engine_abort_all(s.e);
        deadline = now_s() + 5.0;
        while (engine_num_active(s.e) > 0 && now_s() < deadline) usleep(10 * 1000);
    }
    http_server_wait_idle(http, 2.0);
    status = 0;
    goto done;
fail:
    LOG_ERR("server", "%s", err);
done:
    /* HTTP first: closing the connections aborts what is still running; the engine then
       sends each request its final notify while the deferred replies are still valid */
    http_server_stop(http);
    engine_free(s.e);
    model_free(s.m);
    LOG_INFO("server", "stopped");
    return status;
}
