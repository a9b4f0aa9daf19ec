/* http.c — the HTTP/1.1 front end over libmicrohttpd (contract in http.h, design in
 * docs/http.md).
 *
 * Threads: MHD's internal polling thread(s) run every callback here (URI log, access
 * handler, content reader, completion); a watchdog thread sends SSE keep-alive comments
 * and looks for closed peers on suspended connections; application threads call
 * http_reply_write/end/send.
 *
 * Objects: struct http_conn is one request as MHD sees it (created by the URI log
 * callback, freed by the completion callback, touched only by MHD threads). struct
 * http_reply is a deferred answer shared with the application: refcounted, one reference
 * for the server (dropped when MHD completes the request) and one for the application
 * (dropped by http_reply_end/send). The server keeps its live replies in a list for the
 * watchdog and for http_server_stop.
 *
 * Invariants (all under reply->mu):
 *   - `suspended` is true exactly while MHD holds the connection suspended on our behalf;
 *     whoever clears it calls MHD_resume_connection, still under the mutex, so a
 *     connection is resumed once per suspension and never after it completed.
 *   - the content reader never returns 0 without suspending;
 *   - a closed reply never suspends again (stop relies on this);
 *   - on_close runs at most once, never after the application ended the reply, and
 *     http_reply_end/send wait for a running on_close on another thread to return.
 * Lock order: server->mu → reply->mu → MHD's internal mutexes (suspend/resume). MHD does
 * not call back into this file while holding its own mutexes.
 */
#define _GNU_SOURCE
#include "http/http.h"
#include "http/cors.h"
#include "api/error.h"
#include "http/auth.h"
#include "util/err.h"
#include "util/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HTTP_STREAM_BLOCK (32 * 1024) /* most bytes MHD asks the content reader for */
static const char KEEPALIVE_COMMENT[] = ": keep-alive\n\n";

struct http_reply {
    pthread_mutex_t mu;
    pthread_cond_t cond;          /* broadcast when an on_close call returns */
    atomic_int refs;              /* server + application + transient (watchdog) */
    struct http_reply *prev, *next; /* server->replies, under server->mu */
    bool linked;                  /* in server->replies (server->mu) */
    struct MHD_Connection *mhd;   /* valid until `completed` */
    int fd;                       /* the connection's socket, valid until `completed` */
    uint64_t id;
    http_close_fn on_close;
    void *ud;
    struct http_auth *auth;       /* a reference, or NULL: where usage is charged */
    int key_slot;                 /* the request's API key slot, -1 if none */
    size_t q_max;                 /* max_stream_queue_bytes (0: unlimited) */
    /* under mu */
    bool streaming;               /* set at defer, or later by http_reply_start_stream */
    bool stream_queued;           /* the MHD callback response was queued */
    bool overflow;                /* the queue passed q_max: closed, on_close pending */
    bool suspended;               /* see the invariants above */
    bool completed;               /* MHD finished the request: mhd/fd are dead */
    bool closed;                  /* peer gone or server stopping: no more output */
    bool app_done;                /* http_reply_end/send was called */
    bool close_notified;          /* on_close ran (or must never run) */
    bool in_close;                /* on_close is running on close_thread */
    pthread_t close_thread;
    char *q;                      /* [q_cap] byte queue; live bytes are [q_head, q_head+q_len) */
    size_t q_head, q_len, q_cap;
    double last_activity;         /* monotonic seconds of the last write (or keep-alive) */
    size_t bytes_out;             /* body bytes handed to MHD (access log) */
    struct MHD_Response *response; /* non-streaming: the stored answer, until queued */
    int status;
    int prompt_tokens, completion_tokens;
    double ttft_s;
    bool has_usage;
};

struct http_server {
    struct MHD_Daemon *daemon;
    struct http_config cfg;       /* host points at host_copy */
    char *host_copy;
    struct http_route *routes;    /* [n_routes] copied; path/method borrowed */
    int n_routes;
    struct http_auth *auth;       /* API keys, limits, per-key counters */
    int port;
    atomic_uint_fast64_t next_id;
    pthread_mutex_t mu;           /* guards replies, stopping */
    pthread_cond_t cond;          /* wakes the watchdog for stop */
    struct http_reply *replies;   /* live replies the server holds a reference on */
    bool stopping;
    pthread_t watchdog;
    bool watchdog_started;
};

/* One request, owned by MHD's thread for that connection. */
struct http_conn {
    struct http_server *srv;
    struct MHD_Connection *mhd;
    uint64_t id;
    double t_start;
    char client[INET6_ADDRSTRLEN + 8];
    char *uri;                    /* raw request target (malloc'd); query points into it */
    const char *query;
    char method[16];
    char *path;                   /* normalised (malloc'd) */
    const struct http_route *route;
    bool cors_done;               /* a preflight answer: it carries its own CORS headers */
    bool preflight;               /* a CORS preflight, answered once its (empty) body is in */
    char preflight_methods[128];  /* the methods its path serves */
    char *body;                   /* [body_cap] NUL-terminated */
    size_t body_len, body_cap;
    size_t body_seen;             /* bytes received, kept or not */
    bool started;                 /* first access-handler call done */
    bool too_large;               /* body passed max_body_bytes: discarding, then 413 */
    bool handled;                 /* the handler was called */
    bool responded;               /* a response was queued by http_respond */
    int key_slot;                 /* the API key that authenticated it, -1 if none */
    int status;
    size_t bytes;
    struct http_reply *reply;     /* deferred answer (server's reference) */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- replies */

static void reply_ref(struct http_reply *r) { atomic_fetch_add(&r->refs, 1); }

/* Drops one reference; the last one frees the reply (never touches the server). */
static void reply_unref(struct http_reply *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1) return;
    if (r->response) MHD_destroy_response(r->response);
    if (r->auth) auth_unref(r->auth);
    free(r->q);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Resumes the connection if we hold it suspended. Caller holds r->mu. */
static void reply_wake_locked(struct http_reply *r)
{
    if (r->suspended && !r->completed) {
        r->suspended = false;
        MHD_resume_connection(r->mhd);
    }
}

/* Appends to the byte queue. Caller holds r->mu. Returns false on allocation failure or
 * when the queue would pass q_max; the latter drops the queue and marks the reply
 * closed and overflowed (the watchdog then calls on_close). */
static bool reply_queue_locked(struct http_reply *r, const char *data, size_t len)
{
    if (r->q_max && r->q_len + len > r->q_max) {
        LOG_WARN("http", "req-%llu client reads too slowly: more than %zu bytes queued, closing",
                 (unsigned long long)r->id, r->q_max);
        free(r->q);
        r->q = NULL;
        r->q_head = r->q_len = r->q_cap = 0;
        r->overflow = true;
        r->closed = true;
        reply_wake_locked(r);
        return false;
    }
    if (r->q_head > 0 && r->q_head + r->q_len + len > r->q_cap) {
        memmove(r->q, r->q + r->q_head, r->q_len);
        r->q_head = 0;
    }
    if (r->q_len + len > r->q_cap) {
        size_t cap = r->q_cap ? r->q_cap : 4096;
        while (cap < r->q_len + len) cap *= 2;
        char *q = realloc(r->q, cap);
        if (!q) return false;
        r->q = q;
        r->q_cap = cap;
    }
    memcpy(r->q + r->q_head + r->q_len, data, len);
    r->q_len += len;
    return true;
}

/* Marks r closed and calls on_close once unless the application already ended it. Any
 * server thread; the caller holds a reference and no lock. */
static void reply_notify_close(struct http_reply *r)
{
    pthread_mutex_lock(&r->mu);
    r->closed = true;
    reply_wake_locked(r);
    if (r->app_done || r->close_notified || !r->on_close) {
        r->close_notified = true;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    r->close_notified = true;
    r->in_close = true;
    r->close_thread = pthread_self();
    pthread_mutex_unlock(&r->mu);

    LOG_DEBUG("http", "req-%llu client gone", (unsigned long long)r->id);
    r->on_close(r->ud);

    pthread_mutex_lock(&r->mu);
    r->in_close = false;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

/* The application's end of a reply: waits out an on_close running on another thread
 * (so on_close never runs after this returns), then marks the reply done. Caller holds
 * r->mu; returns with it held. Returns false if the reply was already ended. */
static bool reply_finish_locked(struct http_reply *r)
{
    while (r->in_close && !pthread_equal(r->close_thread, pthread_self()))
        pthread_cond_wait(&r->cond, &r->mu);
    if (r->app_done) return false;
    r->app_done = true;
    r->close_notified = true;
    return true;
}

/* MHD content reader for streaming replies: hands out queued bytes; on an empty queue
 * suspends the connection (under r->mu, so a concurrent write sees `suspended` and
 * resumes it) and returns 0. MHD thread. */
static ssize_t reply_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct http_reply *r = cls;
    ssize_t ret;
    (void)pos;
    pthread_mutex_lock(&r->mu);
    if (r->closed) {
        ret = MHD_CONTENT_READER_END_WITH_ERROR;
    } else if (r->q_len > 0) {
        size_t n = r->q_len < max ? r->q_len : max;
        memcpy(buf, r->q + r->q_head, n);
        r->q_head += n;
        r->q_len -= n;
        if (r->q_len == 0) r->q_head = 0;
        r->bytes_out += n;
        ret = (ssize_t)n;
    } else if (r->app_done) {
        ret = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        r->suspended = true;
        MHD_suspend_connection(r->mhd);
        ret = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return ret;
}

/* ---------------------------------------------------------------- responses */

/* Adds "Name: value" strings to resp. */
static void add_extra_headers(struct MHD_Response *resp, const char *const *extra)
{
    for (; extra && *extra; extra++) {
        const char *colon = strchr(*extra, ':');
        if (!colon || colon == *extra) {
            LOG_WARN("http", "ignoring malformed extra header '%s'", *extra);
            continue;
        }
        char name[128];
        size_t n = (size_t)(colon - *extra);
        if (n >= sizeof name) continue;
        memcpy(name, *extra, n);
        name[n] = 0;
        const char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        MHD_add_response_header(resp, name, value);
    }
}

/* A buffer response (body copied). NULL on allocation failure. */
static struct MHD_Response *make_response(const char *content_type, const char *body,
                                          size_t len, const char *const *extra)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)(body ? body : ""), MHD_RESPMEM_MUST_COPY);
    if (!resp) return NULL;
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    add_extra_headers(resp, extra);
    return resp;
}

/* The CORS headers of the answer to c's request (cors.h): none unless CORS is on and the
 * request's Origin is allowed. */
static void add_cors_headers(struct http_conn *c, struct MHD_Response *resp)
{
    if (c->srv->cfg.cors.n_origins == 0 || c->cors_done) return;
    char buf[1024];
    const char *hdrs[CORS_MAX_HEADERS + 1];
    const char *origin = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "Origin");
    if (cors_response_headers(&c->srv->cfg.cors, origin, buf, sizeof buf, hdrs) > 0)
        add_extra_headers(resp, hdrs);
}

/* Queues resp with status on c (MHD thread, access handler) and records it for the log. */
static enum MHD_Result conn_queue(struct http_conn *c, int status, struct MHD_Response *resp,
                                  size_t len)
{
    if (!resp) return MHD_NO;
    add_cors_headers(c, resp);
    enum MHD_Result ok = MHD_queue_response(c->mhd, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ok == MHD_YES) {
        c->responded = true;
        c->status = status;
        c->bytes = len;
    } else {
        LOG_ERR("http", "req-%llu cannot queue status %d", (unsigned long long)c->id, status);
    }
    return ok;
}

/* Queues an OpenAI error body. */
static enum MHD_Result conn_error(struct http_conn *c, int status, const char *type,
                                  const char *code, const char *const *extra,
                                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result conn_error(struct http_conn *c, int status, const char *type,
                                  const char *code, const char *const *extra,
                                  const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char *json = api_error_json_fields(msg, type, NULL, code);
    const char *body = json ? json : "{\"error\":{\"message\":\"out of memory\"}}";
    size_t len = strlen(body);
    enum MHD_Result ok = conn_queue(c, status, make_response("application/json", body, len, extra), len);
    free(json);
    return ok;
}

void http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *const *extra_headers)
{
    if (c->responded || c->reply) {
        LOG_ERR("http", "req-%llu answered twice (status %d ignored)", (unsigned long long)c->id,
                status);
        return;
    }
    conn_queue(c, status, make_response(content_type, body, len, extra_headers), len);
}

void http_respond_error(struct http_conn *c, int status, const char *message, const char *type,
                        const char *param, const char *code, const char *const *extra_headers)
{
    char *json = api_error_json_fields(message, type, param, code);
    if (!json) {
        http_respond(c, 500, "text/plain", "out of memory", 13, NULL);
        return;
    }
    http_respond(c, status, "application/json", json, strlen(json), extra_headers);
    free(json);
}

struct http_reply *http_reply_defer(struct http_conn *c, bool streaming, http_close_fn on_close,
                                    void *ud)
{
    if (c->responded || c->reply) {
        LOG_ERR("http", "req-%llu deferred after answering", (unsigned long long)c->id);
        return NULL;
    }
    struct http_reply *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cond, NULL);
    atomic_init(&r->refs, 2); /* server + application */
    r->mhd = c->mhd;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mhd, MHD_CONNECTION_INFO_CONNECTION_FD);
    r->fd = ci ? ci->connect_fd : -1;
    r->id = c->id;
    r->streaming = streaming;
    r->on_close = on_close;
    r->ud = ud;
    r->key_slot = c->key_slot;
    if (c->key_slot >= 0) {
        r->auth = c->srv->auth;
        auth_ref(r->auth);
    }
    r->q_max = c->srv->cfg.max_stream_queue_bytes;
    r->status = 200;
    r->ttft_s = -1;
    r->last_activity = now_s();

    struct http_server *s = c->srv;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) r->closed = true; /* stop already swept the list: never suspend */
    r->next = s->replies;
    if (s->replies) s->replies->prev = r;
    s->replies = r;
    r->linked = true;
    pthread_mutex_unlock(&s->mu);
    c->reply = r;
    return r;
}

char *http_take_body(struct http_conn *c, size_t *len)
{
    char *b = c->body;
    *len = b ? c->body_len : 0;
    if (b) b[c->body_len] = 0;
    c->body = NULL;
    c->body_len = c->body_cap = 0;
    return b;
}

bool http_reply_start_stream(struct http_reply *r)
{
    pthread_mutex_lock(&r->mu);
    bool ok = !r->streaming && !r->app_done && !r->response;
    if (ok) {
        r->streaming = true;
        r->last_activity = now_s();
        reply_wake_locked(r); /* conn_reply_ready queues the stream response */
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

bool http_reply_write(struct http_reply *r, const char *data, size_t len)
{
    bool ok = false;
    pthread_mutex_lock(&r->mu);
    if (!r->streaming || r->app_done) {
        LOG_ERR("http", "req-%llu write on a %s reply", (unsigned long long)r->id,
                r->app_done ? "finished" : "non-streaming");
    } else if (!r->closed && !r->completed) {
        ok = len == 0 || reply_queue_locked(r, data, len);
        if (ok && len > 0) {
            r->last_activity = now_s();
            reply_wake_locked(r);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void http_reply_end(struct http_reply *r)
{
    pthread_mutex_lock(&r->mu);
    bool first = reply_finish_locked(r);
    if (first && !r->streaming) {
        /* misuse: a non-streaming reply needs http_reply_send; answer 500 */
        LOG_ERR("http", "req-%llu http_reply_end on a non-streaming reply",
                (unsigned long long)r->id);
        const char *body = "{\"error\":{\"message\":\"no response\",\"type\":\"server_error\","
                           "\"param\":null,\"code\":null}}";
        r->response = make_response("application/json", body, strlen(body), NULL);
        r->status = 500;
        r->bytes_out = strlen(body);
    }
    if (first) reply_wake_locked(r);
    pthread_mutex_unlock(&r->mu);
    if (first) reply_unref(r);
    else LOG_ERR("http", "req-%llu ended twice", (unsigned long long)r->id);
}

void http_reply_send(struct http_reply *r, int status, const char *content_type,
                     const char *body, size_t len, const char *const *extra_headers)
{
    pthread_mutex_lock(&r->mu);
    bool streaming = r->streaming;
    pthread_mutex_unlock(&r->mu);
    if (streaming) {
        /* misuse: deliver the body as stream bytes, then end */
        LOG_ERR("http", "req-%llu http_reply_send on a streaming reply", (unsigned long long)r->id);
        http_reply_write(r, body, len);
        http_reply_end(r);
        return;
    }
    /* build outside the lock: it copies the body */
    struct MHD_Response *resp = make_response(content_type, body, len, extra_headers);
    pthread_mutex_lock(&r->mu);
    bool first = reply_finish_locked(r);
    if (first && !r->closed && !r->completed) {
        r->response = resp;
        r->status = resp ? status : 500;
        r->bytes_out = len;
        resp = NULL;
        reply_wake_locked(r);
    }
    pthread_mutex_unlock(&r->mu);
    if (resp) MHD_destroy_response(resp);
    if (first) reply_unref(r);
    else LOG_ERR("http", "req-%llu sent twice", (unsigned long long)r->id);
}

void http_reply_set_usage(struct http_reply *r, int prompt_tokens, int completion_tokens,
                          double ttft_s)
{
    pthread_mutex_lock(&r->mu);
    r->prompt_tokens = prompt_tokens;
    r->completion_tokens = completion_tokens;
    r->ttft_s = ttft_s;
    r->has_usage = true;
    pthread_mutex_unlock(&r->mu);
    if (r->auth && r->key_slot >= 0)
        auth_charge(r->auth, r->key_slot, prompt_tokens, completion_tokens, now_s());
}

uint64_t http_reply_request_id(const struct http_reply *r) { return r->id; }

struct http_meter {
    struct http_auth *auth; /* one reference */
    int key_slot;
};

int http_reply_meter(const struct http_reply *r, struct http_meter **out)
{
    *out = NULL;
    if (!r->auth || r->key_slot < 0) return 0;
    struct http_meter *m = malloc(sizeof *m);
    if (!m) return ERR_NOMEM;
    auth_ref(r->auth);
    *m = (struct http_meter){ .auth = r->auth, .key_slot = r->key_slot };
    *out = m;
    return 0;
}

void http_meter_charge(struct http_meter *m, int prompt_tokens, int completion_tokens)
{
    if (m) auth_charge(m->auth, m->key_slot, prompt_tokens, completion_tokens, now_s());
}

void http_meter_free(struct http_meter *m)
{
    if (!m) return;
    auth_unref(m->auth);
    free(m);
}

/* ---------------------------------------------------------------- requests */

/* Collapses repeated '/' and drops one trailing '/' (not the root). malloc'd. */
static char *normalise_path(const char *url)
{
    size_t n = strlen(url);
    char *p = malloc(n + 1);
    if (!p) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (url[i] == '/' && j > 0 && p[j - 1] == '/') continue;
        p[j++] = url[i];
    }
    if (j > 1 && p[j - 1] == '/') j--;
    p[j] = 0;
    return p;
}

/* The slot of the API key the request carries (`Authorization: Bearer KEY` or
 * `X-Api-Key: KEY`), or -1 when it carries none that is configured. */
static int request_key(const struct http_conn *c)
{
    struct http_auth *a = c->srv->auth;
    const char *auth = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    if (auth) {
        while (*auth == ' ') auth++;
        if (strncasecmp(auth, "Bearer", 6) == 0 && (auth[6] == ' ' || auth[6] == '\t')) {
            const char *k = auth + 6;
            while (*k == ' ' || *k == '\t') k++;
            size_t len = strlen(k);
            while (len > 0 && (k[len - 1] == ' ' || k[len - 1] == '\t')) len--;
            int slot = auth_match(a, k, len);
            if (slot >= 0) return slot;
        }
    }
    const char *xkey = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "X-Api-Key");
    return xkey ? auth_match(a, xkey, strlen(xkey)) : -1;
}

/* application/json, with or without parameters, any case. */
static bool is_json_type(const char *ct)
{
    while (*ct == ' ') ct++;
    static const char want[] = "application/json";
    if (strncasecmp(ct, want, sizeof want - 1) != 0) return false;
    ct += sizeof want - 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == 0 || *ct == ';';
}

/* Does route r serve the normalised path? Exactly its path, or with HTTP_ROUTE_SUBPATHS
 * its path followed by "/" and at least one more character. */
static bool route_matches(const struct http_route *r, const char *path)
{
    if (!(r->flags & HTTP_ROUTE_SUBPATHS)) return strcmp(r->path, path) == 0;
    size_t n = strlen(r->path);
    return strncmp(r->path, path, n) == 0 && path[n] == '/' && path[n + 1] != 0;
}

/* The answer to a CORS preflight (OPTIONS with Origin and Access-Control-Request-Method;
 * conn_begin marked it) for a path serving c->preflight_methods: 204 with the CORS
 * headers, or 403 saying what is not allowed. Answered before authentication (a browser
 * never sends the API key with a preflight), and only after the request is complete:
 * answered from conn_begin, MHD would close the connection (as for an error whose body
 * is never read), and the browser's request that follows would need a new one. */
static enum MHD_Result conn_preflight(struct http_conn *c)
{
    char buf[4096], err[256];
    const char *hdrs[CORS_MAX_HEADERS + 1];
    const char *origin = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "Origin");
    const char *method = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "Access-Control-Request-Method");
    const char *req_headers = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                          "Access-Control-Request-Headers");
    if (!cors_preflight(&c->srv->cfg.cors, origin, method, req_headers, c->preflight_methods, buf, sizeof buf,
                        hdrs, err, sizeof err))
        return conn_error(c, 403, API_ERR_INVALID_REQUEST, "cors_not_allowed", NULL, "%s", err);
    c->cors_done = true;
    return conn_queue(c, 204, make_response(NULL, "", 0, hdrs), 0);
}

/* The first access-handler call (headers complete, no body yet): routing, authentication,
 * content type and declared size. Queues an error response (MHD then skips the body and
 * closes the connection) or returns MHD_YES to receive the body. */
static enum MHD_Result conn_begin(struct http_conn *c, const char *url, const char *method)
{
    struct http_server *s = c->srv;
    snprintf(c->method, sizeof c->method, "%s", method);
    c->path = normalise_path(url);
    if (!c->path) return MHD_NO;

    bool path_known = false;
    char allow[128] = "";
    for (int i = 0; i < s->n_routes; i++) {
        if (!route_matches(&s->routes[i], c->path)) continue;
        path_known = true;
        if (strcmp(s->routes[i].method, method) == 0) {
            c->route = &s->routes[i];
            break;
        }
        size_t n = strlen(allow);
        snprintf(allow + n, sizeof allow - n, "%s%s", n ? ", " : "", s->routes[i].method);
    }
    if (!path_known)
        return conn_error(c, 404, API_ERR_INVALID_REQUEST, NULL, NULL, "Invalid URL (%s %s)",
                          method, c->path);
    if (!c->route && strcmp(method, "OPTIONS") == 0 && s->cfg.cors.n_origins > 0) {
        const char *origin = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND, "Origin");
        const char *want = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                       "Access-Control-Request-Method");
        if (origin && want) {
            c->preflight = true;
            snprintf(c->preflight_methods, sizeof c->preflight_methods, "%s", allow);
            return MHD_YES; /* answered by conn_preflight once the request is complete */
        }
    }
    if (!c->route) {
        char allow_hdr[160];
        snprintf(allow_hdr, sizeof allow_hdr, "Allow: %s", allow);
        const char *extra[] = { allow_hdr, NULL };
        return conn_error(c, 405, API_ERR_INVALID_REQUEST, "method_not_allowed", extra,
                          "Method %s not allowed for %s (allowed: %s)", method, c->path, allow);
    }
    if (!(c->route->flags & HTTP_ROUTE_PUBLIC) && auth_active(s->auth) > 0) {
        c->key_slot = request_key(c);
        if (c->key_slot < 0)
            return conn_error(c, 401, API_ERR_AUTHENTICATION, "invalid_api_key", NULL,
                              "Incorrect or missing API key. Send it as 'Authorization: "
                              "Bearer KEY' or 'X-Api-Key: KEY'.");
        double wait = 0;
        const char *limit = "";
        if (auth_admit(s->auth, c->key_slot, (c->route->flags & HTTP_ROUTE_METERED) != 0,
                       now_s(), &wait, &limit)) {
            char name[HTTP_KEY_NAME_MAX + 1], retry[48];
            auth_name(s->auth, c->key_slot, name, sizeof name);
            long secs = (long)ceil(wait);
            if (secs < 1) secs = 1;
            snprintf(retry, sizeof retry, "Retry-After: %ld", secs);
            const char *extra[] = { retry, NULL };
            return conn_error(c, 429, API_ERR_RATE_LIMIT, "rate_limit_exceeded", extra,
                              "Rate limit reached for API key '%s' (%s); retry in %ld s",
                              name, !strcmp(limit, "rpm") ? "requests per minute"
                                                          : "tokens per minute", secs);
        }
    }

    const char *cl = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_TRANSFER_ENCODING);
    unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
    bool has_body = declared > 0 || te != NULL;
    if (has_body && strcmp(method, "GET") == 0)
        return conn_error(c, 400, API_ERR_INVALID_REQUEST, NULL, NULL,
                          "A GET request must not have a body");
    if (strcmp(method, "POST") == 0) {
        const char *ct = MHD_lookup_connection_value(c->mhd, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_TYPE);
        if ((ct && !is_json_type(ct)) || (!ct && has_body))
            return conn_error(c, 415, API_ERR_INVALID_REQUEST, "unsupported_media_type", NULL,
                              "Unsupported Content-Type '%s': send application/json",
                              ct ? ct : "(none)");
    }
    if (declared > s->cfg.max_body_bytes)
        return conn_error(c, 413, API_ERR_INVALID_REQUEST, "request_too_large", NULL,
                          "Request body of %llu bytes is larger than the limit of %zu bytes",
                          declared, s->cfg.max_body_bytes);
    if (declared > 0) {
        c->body = malloc((size_t)declared + 1);
        if (!c->body) return MHD_NO;
        c->body_cap = (size_t)declared + 1;
    }
    return MHD_YES;
}

/* Accumulates body bytes; past max_body_bytes keeps discarding
 * so the final call can answer 413 — up to a point: returns false (close the connection
 * without an answer) once a body without Content-Length runs far past the limit. */
static bool conn_body(struct http_conn *c, const char *data, size_t len)
{
    c->body_seen += len;
    if (c->too_large) return c->body_seen <= 2 * c->srv->cfg.max_body_bytes + (1u << 20);
    if (c->body_len + len > c->srv->cfg.max_body_bytes) {
        c->too_large = true;
        free(c->body);
        c->body = NULL;
        c->body_len = c->body_cap = 0;
        return true;
    }
    if (c->body_len + len + 1 > c->body_cap) {
        size_t cap = c->body_cap ? c->body_cap : 4096;
        while (cap < c->body_len + len + 1) cap *= 2;
        char *b = realloc(c->body, cap);
        if (!b) {
            c->too_large = true; /* cannot hold it: same answer */
            return true;
        }
        c->body = b;
        c->body_cap = cap;
    }
    memcpy(c->body + c->body_len, data, len);
    c->body_len += len;
    return true;
}

/* Queues the SSE callback response of a streaming reply. */
static enum MHD_Result conn_queue_stream(struct http_conn *c, struct http_reply *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, HTTP_STREAM_BLOCK, reply_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_cors_headers(c, resp);
    enum MHD_Result ok = MHD_queue_response(c->mhd, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    c->status = 200;
    return ok;
}

/* A deferred reply, after the handler returned or after a resume: start the stream,
 * queue the stored answer, close a closed reply, or (nothing to do yet) suspend until
 * http_reply_send / http_reply_start_stream. MHD thread. */
static enum MHD_Result conn_reply_ready(struct http_conn *c)
{
    struct http_reply *r = c->reply;
    pthread_mutex_lock(&r->mu);
    if (r->streaming && !r->stream_queued) {
        r->stream_queued = true;
        pthread_mutex_unlock(&r->mu);
        return conn_queue_stream(c, r);
    }
    if (r->streaming) { /* already queued: MHD does not call back for it */
        pthread_mutex_unlock(&r->mu);
        return MHD_YES;
    }
    struct MHD_Response *resp = r->closed ? NULL : r->response;
    int status = r->status;
    size_t len = r->bytes_out;
    if (resp) r->response = NULL;
    bool idle = !resp && !r->closed;
    if (idle) {
        r->suspended = true;
        MHD_suspend_connection(c->mhd);
    }
    pthread_mutex_unlock(&r->mu);
    if (idle) return MHD_YES;
    if (!resp) return MHD_NO;
    return conn_queue(c, status, resp, len);
}

/* The whole request is in: call the handler, then queue its answer, start the stream,
 * or suspend until http_reply_send. */
static enum MHD_Result conn_dispatch(struct http_conn *c)
{
    if (c->body) c->body[c->body_len] = 0;
    struct http_request req = {
        .id = c->id,
        .method = c->method,
        .path = c->path,
        .query = c->query,
        .body = c->body ? c->body : "",
        .body_len = c->body_len,
        .client = c->client,
        .conn = c,
    };
    c->handled = true;
    c->route->handler(c->route->ud, &req);
    if (c->responded) return MHD_YES;

    if (!c->reply) {
        LOG_ERR("http", "req-%llu %s %s: handler neither answered nor deferred",
                (unsigned long long)c->id, c->method, c->path);
        return conn_error(c, 500, API_ERR_SERVER, NULL, NULL, "The server did not answer");
    }
    return conn_reply_ready(c);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mhd, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    struct http_conn *c = *con_cls;
    (void)cls;
    (void)mhd;
    (void)version;
    if (!c) return MHD_NO; /* the URI log callback ran out of memory */
    if (!c->started) {
        c->started = true;
        return conn_begin(c, url, method);
    }
    if (*upload_data_size > 0) {
        bool keep = conn_body(c, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return keep ? MHD_YES : MHD_NO;
    }
    if (c->handled) return c->reply ? conn_reply_ready(c) : MHD_NO;
    if (c->preflight) return conn_preflight(c);
    if (c->too_large)
        return conn_error(c, 413, API_ERR_INVALID_REQUEST, "request_too_large", NULL,
                          "Request body is larger than the limit of %zu bytes",
                          c->srv->cfg.max_body_bytes);
    return conn_dispatch(c);
}

/* MHD's URI log callback: the first thing MHD calls for a request (after the request
 * line). Creates the request record that becomes *con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *mhd)
{
    struct http_server *s = cls;
    struct http_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    c->mhd = mhd;
    c->key_slot = -1;
    c->id = atomic_fetch_add(&s->next_id, 1);
    c->t_start = now_s();
    c->uri = strdup(uri ? uri : "");
    if (!c->uri) {
        free(c);
        return NULL;
    }
    char *q = strchr(c->uri, '?');
    c->query = q ? q + 1 : "";
    snprintf(c->client, sizeof c->client, "?");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mhd, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr,
                      c->client, sizeof c->client);
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                      c->client, sizeof c->client);
    }
    return c;
}

static const char *termination_name(enum MHD_RequestTerminationCode toe)
{
    switch (toe) {
    case MHD_REQUEST_TERMINATED_COMPLETED_OK: return "ok";
    case MHD_REQUEST_TERMINATED_WITH_ERROR: return "error";
    case MHD_REQUEST_TERMINATED_TIMEOUT_REACHED: return "timeout";
    case MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN: return "shutdown";
    case MHD_REQUEST_TERMINATED_READ_ERROR: return "read-error";
    case MHD_REQUEST_TERMINATED_CLIENT_ABORT: return "client-abort";
    default: return "unknown";
    }
}

/* MHD's completion callback: the request is over (sent, failed, or the daemon stops).
 * Notifies a live reply's on_close on failure, releases the server's reference, writes
 * the access log line and frees the request. MHD thread. */
static void on_completed(void *cls, struct MHD_Connection *mhd, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *s = cls;
    struct http_conn *c = *con_cls;
    (void)mhd;
    if (!c) return;
    *con_cls = NULL;
    int status = c->status;
    size_t bytes = c->bytes;
    char usage[96] = "";
    struct http_reply *r = c->reply;
    if (r) {
        pthread_mutex_lock(&r->mu);
        if (r->streaming) bytes = r->bytes_out;
        if (r->has_usage) {
            int n = snprintf(usage, sizeof usage, " prompt=%d completion=%d", r->prompt_tokens,
                             r->completion_tokens);
            if (r->ttft_s >= 0 && n > 0 && (size_t)n < sizeof usage)
                snprintf(usage + n, sizeof usage - (size_t)n, " ttft=%.0fms", r->ttft_s * 1e3);
        }
        /* mhd/fd die with this request: nobody may resume or poll them from now on */
        r->completed = true;
        r->closed = true;
        r->suspended = false;
        pthread_mutex_unlock(&r->mu);
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) reply_notify_close(r);
        pthread_mutex_lock(&s->mu);
        if (r->linked) {
            if (r->prev) r->prev->next = r->next;
            else s->replies = r->next;
            if (r->next) r->next->prev = r->prev;
            r->linked = false;
        }
        pthread_mutex_unlock(&s->mu);
        reply_unref(r);
    }
    double ms = (now_s() - c->t_start) * 1e3;
    char key[HTTP_KEY_NAME_MAX + 8] = "";
    if (c->key_slot >= 0) {
        memcpy(key, " key=", 5);
        auth_name(s->auth, c->key_slot, key + 5, sizeof key - 5);
    }
    if (c->started)
        LOG_INFO("http", "req-%llu %s %s %s %d %zuB %.0fms%s%s%s%s", (unsigned long long)c->id,
                 c->client, c->method, c->path ? c->path : "?", status, bytes, ms, key, usage,
                 toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted=",
                 toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : termination_name(toe));
    else
        LOG_INFO("http", "req-%llu %s - %s - 0B %.0fms aborted=%s", (unsigned long long)c->id,
                 c->client, c->uri, ms, termination_name(toe));
    free(c->body);
    free(c->path);
    free(c->uri);
    free(c);
}

/* MHD's own error messages, into our log. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    /* per-connection endings (client gone, header too large) are routine: the access log
     * line already says "aborted=..." */
    if (strcasestr(line, "closing connection"))
        LOG_DEBUG("http", "libmicrohttpd: %s", line);
    else
        LOG_WARN("http", "libmicrohttpd: %s", line);
}

/* ---------------------------------------------------------------- watchdog */

/* Has the peer of a suspended connection closed (or reset) it? Pending request bytes
 * (a pipelined request) do not count; a half-close (FIN) does. */
static bool peer_closed(int fd)
{
    if (fd < 0) return false;
    struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

/* The watchdog tick: short enough to send keep-alives on time and to notice a gone
 * client within ~1/4 s. */
static double watchdog_tick_s(const struct http_config *cfg)
{
    double t = cfg->keepalive_s > 0 ? cfg->keepalive_s / 3 : 0.25;
    if (t > 0.25) t = 0.25;
    if (t < 0.02) t = 0.02;
    return t;
}

static void *watchdog_main(void *arg)
{
    struct http_server *s = arg;
    double tick = watchdog_tick_s(&s->cfg);
    struct http_reply **gone = NULL;
    size_t n_gone = 0, cap_gone = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double frac = ts.tv_nsec * 1e-9 + tick;
        ts.tv_sec += (time_t)frac;
        ts.tv_nsec = (long)((frac - (double)(time_t)frac) * 1e9);
        pthread_cond_timedwait(&s->cond, &s->mu, &ts);
        if (s->stopping) break;

        double now = now_s();
        for (struct http_reply *r = s->replies; r; r = r->next) {
            pthread_mutex_lock(&r->mu);
            bool peer_gone = !r->closed && !r->completed && r->suspended && peer_closed(r->fd);
            if (peer_gone) {
                /* closed before resuming: the resumed reader/handler then ends it */
                r->closed = true;
                reply_wake_locked(r);
            }
            /* a reader too slow for its queue is gone too (reply_queue_locked closed it) */
            if (peer_gone || (r->overflow && !r->close_notified)) {
                if (n_gone == cap_gone) {
                    size_t cap = cap_gone ? cap_gone * 2 : 16;
                    struct http_reply **g = realloc(gone, cap * sizeof *g);
                    if (g) {
                        gone = g;
                        cap_gone = cap;
                    }
                }
                if (n_gone < cap_gone) {
                    reply_ref(r);
                    gone[n_gone++] = r;
                }
            }
            if (r->streaming && !r->closed && !r->completed && !r->app_done &&
                s->cfg.keepalive_s > 0 && now - r->last_activity >= s->cfg.keepalive_s) {
                if (reply_queue_locked(r, KEEPALIVE_COMMENT, sizeof KEEPALIVE_COMMENT - 1)) {
                    r->last_activity = now;
                    reply_wake_locked(r);
                }
            }
            pthread_mutex_unlock(&r->mu);
        }
        if (n_gone == 0) continue;
        /* on_close runs without the server lock: it may call back into http_reply_* */
        pthread_mutex_unlock(&s->mu);
        for (size_t i = 0; i < n_gone; i++) {
            reply_notify_close(gone[i]);
            reply_unref(gone[i]);
        }
        n_gone = 0;
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    free(gone);
    return NULL;
}

/* ---------------------------------------------------------------- server */

void http_config_default(struct http_config *c)
{
    *c = (struct http_config){
        .host = "127.0.0.1",
        .port = 8000,
        .keys = NULL,
        .n_keys = 0,
        .max_body_bytes = 16u << 20,
        .max_header_bytes = 64u << 10,
        .max_connections = 1024,
        .max_connections_per_ip = 256,
        .max_stream_queue_bytes = 4u << 20,
        .timeout_s = 60,
        .keepalive_s = 5.0,
        .n_threads = 1,
    };
}

/* Binds and listens on host:port (non-blocking, SO_REUSEADDR; "::" also takes IPv4). */
static int listen_on(const char *host, int port, int backlog, int *out_fd, int *out_port,
                     char *err, size_t errlen)
{
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, port_s, &hints, &ai);
    if (rc != 0)
        return err_set(err, errlen, ERR_IO, "cannot bind %s:%d: %s", host, port,
                       gai_strerror(rc));
    int fd = -1, saved = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1, zero = 0;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return err_set(err, errlen, ERR_IO, "cannot bind %s:%d: %s", host, port,
                       strerror(saved));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    *out_port = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        *out_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out_fd = fd;
    return 0;
}

static void server_free(struct http_server *s)
{
    auth_unref(s->auth);
    free(s->routes);
    free(s->host_copy);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int http_server_start(struct http_server **out, const struct http_config *c,
                      const struct http_route *routes, int n_routes, char *err, size_t errlen)
{
    *out = NULL;
    if (!c->host || c->port < 0 || c->port > 65535 || c->n_threads < 1 || n_routes < 0 ||
        c->max_connections < 1 || c->n_keys < 0 || (c->n_keys > 0 && !c->keys))
        return err_set(err, errlen, ERR_INVALID, "invalid HTTP configuration");
    for (int i = 0; i < n_routes; i++)
        if (!routes[i].method || !routes[i].path || !routes[i].handler)
            return err_set(err, errlen, ERR_INVALID, "route %d is incomplete", i);

    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    atomic_init(&s->next_id, 1);
    s->cfg = *c;
    s->host_copy = strdup(c->host);
    s->routes = malloc(sizeof *s->routes * (size_t)(n_routes ? n_routes : 1));
    s->auth = auth_create();
    int rc = ERR_NOMEM;
    int fd = -1;
    if (!s->host_copy || !s->routes || !s->auth) {
        err_set(err, errlen, ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->cfg.host = s->host_copy;
    s->cfg.keys = NULL;
    s->cfg.n_keys = 0;
    memcpy(s->routes, routes, sizeof *s->routes * (size_t)n_routes);
    s->n_routes = n_routes;
    if ((rc = auth_set_keys(s->auth, c->keys, c->n_keys, err, errlen))) goto fail;

    rc = listen_on(c->host, c->port, 511, &fd, &s->port, err, errlen);
    if (rc) goto fail;

    size_t mem = c->max_header_bytes < 4096 ? 4096 : c->max_header_bytes;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    /* THREAD_POOL_SIZE comes last so that with one thread MHD_OPTION_END takes its place */
    s->daemon = MHD_start_daemon(
        flags, 0, NULL, NULL, on_access, s,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, (void *)s, /* first, so it sees everything */
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, (void *)s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, (void *)s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, mem,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(c->max_connections_per_ip > 0
                                                           ? c->max_connections_per_ip : 0),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(c->timeout_s > 0 ? c->timeout_s : 0),
        c->n_threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (unsigned)c->n_threads,
        MHD_OPTION_END);
    if (!s->daemon) {
        rc = err_set(err, errlen, ERR_IO, "cannot start the HTTP server on %s:%d", c->host,
                     s->port);
        goto fail;
    }
    fd = -1; /* MHD owns it now */
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        rc = err_set(err, errlen, ERR_IO, "cannot start the HTTP watchdog thread");
        goto fail;
    }
    s->watchdog_started = true;
    LOG_INFO("http", "listening on %s:%d (%d thread%s)", c->host, s->port, c->n_threads,
             c->n_threads > 1 ? "s" : "");
    *out = s;
    return 0;

fail:
    if (s->daemon) MHD_stop_daemon(s->daemon);
    if (fd >= 0) close(fd);
    server_free(s);
    return rc;
}

int http_server_port(const struct http_server *s) { return s->port; }

int http_server_set_keys(struct http_server *s, const struct http_key *keys, int n, char *err,
                         size_t errlen)
{
    return auth_set_keys(s->auth, keys, n, err, errlen);
}

int http_server_key_stats(struct http_server *s, struct http_key_stats *out, int cap)
{
    return auth_stats(s->auth, out, cap);
}

bool http_server_wait_idle(struct http_server *s, double timeout_s)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool idle = s->replies == NULL;
        pthread_mutex_unlock(&s->mu);
        if (idle) return true;
        if (now_s() >= deadline) return false;
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
}

void http_server_stop(struct http_server *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    if (s->watchdog_started) pthread_join(s->watchdog, NULL);

    MHD_socket lfd = MHD_quiesce_daemon(s->daemon); /* no new connections */
    /* MHD_stop_daemon must not meet a suspended connection: close every live reply and
     * resume it; a closed reply never suspends again, and replies deferred from now on
     * start closed (s->stopping). The resumed connections end with an error, which calls
     * on_close from the completion callback. */
    pthread_mutex_lock(&s->mu);
    for (struct http_reply *r = s->replies; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        r->closed = true;
        reply_wake_locked(r);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->daemon);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    if (s->replies) LOG_ERR("http", "replies still linked after stop");
    LOG_INFO("http", "stopped");
    server_free(s);
}
