/* http.h — the HTTP/1.1 front end (libmicrohttpd), independent of what is served.
 *
 * The server runs libmicrohttpd with its internal polling thread(s) (epoll),
 * MHD_ALLOW_SUSPEND_RESUME and keep-alive. Routes are data (struct http_route): a method,
 * an exact path, a handler and flags. For each request the server:
 *   1. normalises the path (repeated '/' collapsed, one trailing '/' dropped; the query
 *      string is kept apart), finds the route — unknown path → 404, known path with
 *      another method → 405 (with Allow) — all errors as OpenAI error JSON built by
 *      api_error_json (api/error.h);
 *   2. authenticates (unless the route is HTTP_ROUTE_PUBLIC) BEFORE reading the body:
 *      `Authorization: Bearer KEY` or `X-Api-Key: KEY`, constant-time comparison against
 *      every configured key → 401 invalid_api_key; on an HTTP_ROUTE_METERED route the
 *      key's requests-per-minute and tokens-per-minute limits → 429 + Retry-After;
 *   3. for POST: Content-Type must be application/json (parameters allowed) → else 415;
 *      the body is accumulated up to max_body_bytes → else 413 (early, from
 *      Content-Length when present); a GET with a body → 400;
 *   4. calls the handler once, on an MHD thread, with the whole body.
 * With CORS configured (http/cors.h), a browser's preflight (OPTIONS with Origin and
 * Access-Control-Request-Method on a known path) is answered in step 1, before
 * authentication (204, or 403 naming what is not allowed), and every answer to a request
 * from an allowed Origin — errors and streams included — carries Access-Control-Allow-Origin.
 * The handler must not block. It answers either at once (http_respond) or later through a
 * deferred reply (http_reply_defer), which is how streams and engine-backed requests work.
 *
 * Deferred replies. A streaming reply (SSE) sends its status and headers when the handler
 * returns; the application then appends bytes from any thread (http_reply_write); the
 * content reader hands queued bytes to MHD and, when the queue is empty, suspends the
 * connection under the reply's mutex (never returning 0 without suspending); a write
 * resumes it. The bytes queued for one stream are bounded (max_stream_queue_bytes): a
 * client that reads slower than the application writes past that bound is treated as
 * gone (the queue is dropped, writes fail, on_close is called). A non-streaming deferred
 * reply keeps the connection suspended until the application calls http_reply_send with
 * the full response, or turns it into a stream with http_reply_start_stream (so that a
 * handler can defer at once and decide on a worker thread, after parsing the body,
 * whether the answer is an error status or a stream).
 * A watchdog thread, every ~second: writes ": keep-alive\n\n" to a streaming reply that
 * has sent nothing for keepalive_s; checks each suspended connection's socket for a
 * closed peer (poll POLLRDHUP / recv MSG_PEEK). A client disconnect — seen by the
 * watchdog, a failed write, or MHD's completion callback with an error — calls the
 * reply's on_close callback exactly once (from some server thread), so the application
 * can abort the work behind it. on_close is never called after the application ended the
 * reply.
 *
 * Ownership: the application holds a deferred reply from http_reply_defer until it calls
 * exactly one of http_reply_end (streaming) or http_reply_send (non-streaming) — also
 * after on_close. The server frees the reply once that call was made and the connection
 * is done with it.
 *
 * Access log: one INFO line per request when it completes: request id, client, method,
 * path, status, bytes, duration, and (if the application set them) prompt / completion
 * tokens and time to first token.
 */
#ifndef TESSERA_HTTP_HTTP_H
#define TESSERA_HTTP_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/cors.h"

struct http_server;
struct http_reply;

/* A request as the handler sees it; everything is borrowed for the handler call. */
struct http_request {
    uint64_t id;              /* per-server request number, from 1 (for logs: "req-<id>") */
    const char *method;       /* "GET", "POST", ... */
    const char *path;         /* normalised, without the query string */
    const char *query;        /* after '?', "" if none */
    const char *body;         /* [body_len] the request body, NUL-terminated ("" if none) */
    size_t body_len;
    const char *client;       /* peer address as text */
    struct http_conn *conn;   /* opaque: for http_respond / http_reply_defer */
};

typedef void (*http_handler_fn)(void *ud, const struct http_request *req);

enum {
    HTTP_ROUTE_PUBLIC = 1 << 0,  /* no API key needed */
    HTTP_ROUTE_METERED = 1 << 1, /* counts against a key's rpm / tpm limits */
    HTTP_ROUTE_SUBPATHS = 1 << 2, /* serves path + "/..." (not path itself): the handler
                                     reads the rest from req->path */
};

#define HTTP_KEY_NAME_MAX 64

/* One API key. The name is what the access log and the metrics show; the key itself is
 * never logged. */
struct http_key {
    const char *name;         /* 1..HTTP_KEY_NAME_MAX of A-Z a-z 0-9 - _ . @ : */
    const char *key;
    int64_t rpm;              /* requests per minute on metered routes; <= 0: unlimited */
    int64_t tpm;              /* prompt + completion tokens per minute; <= 0: unlimited */
};

/* Per key name, since the server started (also for names no longer configured). */
struct http_key_stats {
    char name[HTTP_KEY_NAME_MAX + 1];
    bool active;              /* configured now */
    uint64_t requests;        /* authenticated requests (any route) */
    uint64_t rate_limited_rpm, rate_limited_tpm; /* refused with 429 */
    uint64_t prompt_tokens, completion_tokens;   /* reported by http_reply_set_usage */
};

/* Is name usable as a key name (and so as a metric label value without escaping)? */
bool http_key_name_valid(const char *name);

struct http_route {
    const char *method;
    const char *path;         /* exact, normalised ("/v1/chat/completions"); with
                                 HTTP_ROUTE_SUBPATHS the prefix of the paths served */
    http_handler_fn handler;
    void *ud;
    unsigned flags;
};

struct http_config {
    const char *host;         /* address to bind ("127.0.0.1", "0.0.0.0", "::") */
    int port;                 /* 0: any free port (see http_server_port) */
    const struct http_key *keys; /* [n_keys] (copied); none → no authentication */
    int n_keys;
    size_t max_body_bytes;    /* larger bodies → 413 */
    size_t max_header_bytes;  /* per-connection memory for the request line + headers */
    int max_connections;
    int max_connections_per_ip; /* 0: unlimited */
    size_t max_stream_queue_bytes; /* bytes one stream may have queued; past it the client
                                      counts as gone. 0: unlimited */
    int timeout_s;            /* idle connection timeout (not applied while suspended) */
    double keepalive_s;       /* SSE comment interval while a stream is silent */
    int n_threads;            /* MHD polling threads (>= 1) */
    struct http_cors cors;    /* browser access (http/cors.h); strings borrowed: they must
                                 outlive the server. No origins: CORS off */
};

/* Fills c with the defaults: 127.0.0.1:8000, no keys, 16 MiB body, 64 KiB headers,
 * 1024 connections, 256 per IP, 4 MiB per stream queue, 60 s timeout, keep-alive 5 s,
 * 1 thread. */
void http_config_default(struct http_config *c);

/* Starts listening and serving routes[0, n_routes) (copied; handlers' ud borrowed).
 * Returns 0, or ERR_IO (cannot bind: the reason names host:port) / ERR_INVALID. */
int http_server_start(struct http_server **out, const struct http_config *c,
                      const struct http_route *routes, int n_routes, char *err, size_t errlen);
/* The port actually bound (useful with port 0). */
int http_server_port(const struct http_server *s);
/* Replaces the API keys (start-up, SIGHUP): names that stay keep their limiter state;
 * requests already authenticated are not affected. With n == 0 authentication is off.
 * Returns 0, or ERR_INVALID (duplicate or invalid name, empty or duplicate key: err
 * names the entry, never a key) with the old keys still in force. Any thread. */
int http_server_set_keys(struct http_server *s, const struct http_key *keys, int n, char *err,
                         size_t errlen);
/* Copies up to cap per-key counters into out (see struct http_key_stats); returns how
 * many names there are. Any thread. */
int http_server_key_stats(struct http_server *s, struct http_key_stats *out, int cap);
/* Waits until no deferred reply is open any more (every stream and deferred answer has
 * been ended by the application and sent, or its client is gone), or timeout_s passes.
 * Returns true when idle. For the end of a drain, before http_server_stop. Any thread
 * except the server's own. */
bool http_server_wait_idle(struct http_server *s, double timeout_s);
/* Stops accepting, closes every connection (each live deferred reply gets on_close),
 * stops the threads and frees the server. Deferred replies still held by the application
 * stay valid until it ends them. NULL is a no-op. */
void http_server_stop(struct http_server *s);

/* Immediate answer from the handler: status, content type, body (copied). extra_headers
 * is NULL or "Name: value" strings terminated by NULL (e.g. "Retry-After: 1"). */
void http_respond(struct http_conn *c, int status, const char *content_type, const char *body,
                  size_t len, const char *const *extra_headers);
/* Immediate OpenAI error JSON answer: api_error_json(message, type, param, code). */
void http_respond_error(struct http_conn *c, int status, const char *message, const char *type,
                        const char *param, const char *code, const char *const *extra_headers);

/* From the handler: takes the request body (malloc'd, NUL-terminated, *len set; the
 * caller frees it), so that a worker thread can parse it after the handler returned.
 * NULL with *len 0 when there is none. req->body must not be used afterwards. */
char *http_take_body(struct http_conn *c, size_t *len);

typedef void (*http_close_fn)(void *ud);

/* From the handler: answers later. streaming → 200 with Content-Type: text/event-stream,
 * Cache-Control: no-cache, X-Accel-Buffering: no, chunked, sent when the handler returns.
 * on_close(ud) as described above (may be NULL). Returns NULL on allocation failure (the
 * server then answers 500). */
struct http_reply *http_reply_defer(struct http_conn *c, bool streaming, http_close_fn on_close,
                                    void *ud);
/* Non-streaming, not yet sent: turns the reply into a stream (200, the headers above);
 * output then goes through http_reply_write / http_reply_end. Any thread. Returns false
 * (and changes nothing) if the reply was already sent or is streaming. */
bool http_reply_start_stream(struct http_reply *r);
/* Streaming: appends data[0, len) (copied) and wakes the connection. Any thread. Returns
 * false if the client is gone, or if the queue would pass max_stream_queue_bytes, which
 * also drops the queue and counts as the client being gone (on_close follows). */
bool http_reply_write(struct http_reply *r, const char *data, size_t len);
/* Streaming: the last byte has been written; the response completes once the queue
 * drains. Releases the application's hold. Any thread. */
void http_reply_end(struct http_reply *r);
/* Non-streaming: the full response (copied), as http_respond. Releases the application's
 * hold. Any thread. */
void http_reply_send(struct http_reply *r, int status, const char *content_type,
                     const char *body, size_t len, const char *const *extra_headers);
/* Adds token counts and time to first token (seconds, < 0: none) to the access log line,
 * and charges the tokens to the request's API key (its tpm limit and counters). Call it
 * once per reply. */
void http_reply_set_usage(struct http_reply *r, int prompt_tokens, int completion_tokens,
                          double ttft_s);
/* The id of the request this reply answers (struct http_request.id). */
uint64_t http_reply_request_id(const struct http_reply *r);

/* Charges tokens known only after the reply was sent (a background job) to the API key
 * of the request r answers. http_reply_meter: *out is NULL when there is nothing to
 * charge (no keys configured); call it before the reply is sent. Returns 0 or ERR_NOMEM.
 * The meter stays valid after the reply and the server are gone; charge it any number of
 * times from any thread, free it once. */
struct http_meter;
int http_reply_meter(const struct http_reply *r, struct http_meter **out);
void http_meter_charge(struct http_meter *m, int prompt_tokens, int completion_tokens);
void http_meter_free(struct http_meter *m);

#endif
