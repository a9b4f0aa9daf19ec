/* server_internal.h — state shared by the files of src/server/ (not a public interface).
 *
 * struct server is built once by server_run on the main thread and is read-only for the
 * handlers afterwards, except the atomics and what the signal thread guards with `mu`.
 */
#ifndef TESSERA_SERVER_INTERNAL_H
#define TESSERA_SERVER_INTERNAL_H

#include "api/openai.h"
#include "config/options.h"
#include "engine/engine.h"
#include "http/http.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct workq;
struct bg_registry;
struct bg_follower_ops;

enum server_state { SERVER_LOADING = 0, SERVER_READY, SERVER_DRAINING };

struct server {
    const struct server_options *o;
    _Atomic int state;               /* enum server_state */
    struct model *m;                 /* NULL while loading */
    struct engine *e;                /* NULL while loading */
    struct oai_ctx ctx;              /* valid once READY */
    struct bg_registry *bg;          /* running background responses (with ctx.responses) */
    const char *names[OPTS_MAX_LIST];/* served model names (ctx.served_names points here) */
    int n_names;
    char default_name[256];          /* the model path's basename when no name is given */
    int64_t started;                 /* unix seconds, "created" of /v1/models */
    struct http_server *http;        /* set before READY */
    struct workq *workers;           /* parse / template / tokenize (--api-threads) */
    atomic_int n_tasks;              /* queued or running on workers */
    /* signals (the signal thread) */
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* broadcast at the first SIGTERM / SIGINT */
    int stop_signal;                 /* under mu: the first one, 0 before */
    bool stopping;                   /* under mu: tearing down (no key reloads) */
};

/* POST /v1/chat/completions and /v1/completions (completion.c). ud is the struct server. */
void server_handle_chat(void *ud, const struct http_request *req);
void server_handle_completion(void *ud, const struct http_request *req);
/* POST /v1/responses (completion.c): OpenAI's Responses API over the chat path. */
void server_handle_responses(void *ud, const struct http_request *req);
/* GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel (response_routes.c):
 * a stored response (api/response_store.h) as it was sent; DELETE forgets it; cancel stops
 * a running background response (server/background.h). 404 when it is not (or no longer)
 * kept. */
void server_handle_get_response(void *ud, const struct http_request *req);
void server_handle_delete_response(void *ud, const struct http_request *req);
void server_handle_response_action(void *ud, const struct http_request *req);

/* A deferred reply following a streamed background response (server/background.h;
 * response_routes.c): start turns it into a stream, write appends an event, end ends it. */
extern const struct bg_follower_ops server_reply_follower;

/* Runs fn(arg) on a worker thread (the HTTP threads must not parse, render or tokenize).
 * Returns false when the worker queue is full (the caller answers 429). Any thread. */
bool server_work(struct server *s, void (*fn)(void *), void *arg);

/* Answers 503 unless the server is READY; returns true when it answered. */
bool server_refuse_unless_ready(struct server *s, const struct http_request *req);
/* Answers with e as OpenAI error JSON (429 also gets Retry-After): from the handler, or
 * through a deferred reply (any thread; a fixed out-of-memory body when formatting fails). */
void server_respond_api_error(const struct http_request *req, const struct api_error *e);
void server_reply_api_error(struct http_reply *r, const struct api_error *e);

#endif
