/* response_routes.c — the Responses API's routes on one response:
 *   GET    /v1/responses/{id}         the stored object (a background response's latest
 *                                     snapshot while it runs); with ?stream=true a
 *                                     streamed background response's events after
 *                                     starting_after, then the rest as they come
 *   GET    /v1/responses/{id}/input_items  the conversation items it was made from
 *                                     (api/response_items.h)
 *   DELETE /v1/responses/{id}         forgets it (a running background response is
 *                                     stopped: nothing of it is kept)
 *   POST   /v1/responses/{id}/cancel  stops a running background response; answered with
 *                                     its final object ("cancelled") once it has stopped
 * 404 response_not_found when the server keeps no such response (or none at all). Stored
 * objects live in api/response_store.h; running background responses in
 * server/background.h. Handlers run on HTTP threads and never block: a cancel defers
 * its answer to the job's end (the next engine step).
 */
#include "api/response_items.h"
#include "api/response_store.h"
#include "server/background.h"
#include "server/server_internal.h"
#include "util/err.h"
#include "util/query.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "/v1/responses/"

/* The 404 for response id (the first len bytes of it). */
static void not_found(struct server *s, struct http_conn *conn, const char *id, size_t len)
{
    char msg[320];
    snprintf(msg, sizeof msg, "Response with id '%.*s' not found.%s", (int)(len < 64 ? len : 64), id,
             s->ctx.responses ? "" : " This server keeps no responses (--response-store-mb 0).");
    http_respond_error(conn, 404, msg, API_ERR_INVALID_REQUEST, NULL, "response_not_found", NULL);
}

/* A deferred reply's OpenAI error answer. */
static void reply_error(struct http_reply *r, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reply_error(struct http_reply *r, int status, const char *type, const char *code, const char *fmt, ...)
{
    struct api_error e;
    char msg[sizeof e.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error_set(&e, status, type, NULL, code, "%s", msg);
    server_reply_api_error(r, &e);
}

/* The stored response named by a /v1/responses/{id} path: its id, or NULL after a 404. */
static const char *stored_id(struct server *s, const struct http_request *req)
{
    const char *id = req->path + strlen(PREFIX);
    if (s->ctx.responses && resp_store_get(s->ctx.responses, id, NULL, NULL) == 0) return id;
    not_found(s, req->conn, id, strlen(id));
    return NULL;
}

/* GET /v1/responses/{id}/input_items */
static void list_input_items(struct server *s, const struct http_request *req, const char *id, size_t len)
{
    char rid[128];
    struct resp_items_query q;
    struct api_error e;
    if (resp_items_query_parse(req->query, &q, &e)) {
        server_respond_api_error(req, &e);
        return;
    }
    char *items = NULL, *list = NULL;
    int rc = ERR_NOT_FOUND;
    if (s->ctx.responses && len < sizeof rid) {
        memcpy(rid, id, len);
        rid[len] = 0;
        rc = resp_store_get(s->ctx.responses, rid, NULL, &items);
    }
    if (rc == ERR_NOT_FOUND) {
        not_found(s, req->conn, id, len);
        return;
    }
    if (!rc && resp_items_list(items, &q, &list, &e) == 0)
        http_respond(req->conn, 200, "application/json", list, strlen(list), NULL);
    else if (rc)
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
    else
        server_respond_api_error(req, &e);
    free(items);
    free(list);
}

static void follower_start(void *fd) { http_reply_start_stream(fd); }
static bool follower_write(void *fd, const char *ev, size_t len) { return http_reply_write(fd, ev, len); }
static void follower_end(void *fd) { http_reply_end(fd); }

const struct bg_follower_ops server_reply_follower = { follower_start, follower_write, follower_end };

/* GET /v1/responses/{id}?stream=true[&starting_after=N]: follows a streamed background
 * response from the event after N. Answered with a status (400, 404) when it cannot. */
static void follow_stream(struct server *s, const struct http_request *req, const char *id)
{
    char v[32];
    long after = -1;
    int got = query_get(req->query, "starting_after", v, sizeof v);
    char *stop = NULL;
    if (got > 0) after = strtol(v, &stop, 10);
    if (got < 0 || (got > 0 && (!v[0] || *stop || after < 0))) {
        http_respond_error(req->conn, 400, "'starting_after' must be a sequence number (an integer >= 0)",
                           API_ERR_INVALID_REQUEST, "starting_after", NULL, NULL);
        return;
    }
    struct http_reply *r = http_reply_defer(req->conn, false, NULL, NULL);
    if (!r) return; /* the HTTP layer answers 500 */
    int rc = s->ctx.responses ? bg_follow(s->bg, id, after, &server_reply_follower, r) : ERR_NOT_FOUND;
    if (!rc) return; /* a follower: ended with the response */
    if (rc == ERR_NOT_FOUND && (!s->ctx.responses || resp_store_get(s->ctx.responses, id, NULL, NULL)))
        reply_error(r, 404, API_ERR_INVALID_REQUEST, "response_not_found", "Response with id '%.64s' not found.", id);
    else if (rc == ERR_NOT_FOUND)
        reply_error(r, 400, API_ERR_INVALID_REQUEST, NULL,
                    "the response is not running any more; GET it without 'stream' for its final object");
    else if (rc == ERR_UNSUPPORTED)
        reply_error(r, 400, API_ERR_INVALID_REQUEST, NULL,
                    "only a background response created with 'stream': true can be streamed again");
    else if (rc == ERR_RANGE)
        reply_error(r, 400, API_ERR_INVALID_REQUEST, NULL, "'starting_after' is past the response's last event");
    else
        reply_error(r, 500, API_ERR_SERVER, NULL, "out of memory");
}

void server_handle_get_response(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    const char *rest = req->path + strlen(PREFIX), *slash = strchr(rest, '/');
    if (slash && !strcmp(slash, "/input_items")) {
        list_input_items(s, req, rest, (size_t)(slash - rest));
        return;
    }
    char v[8];
    if (query_get(req->query, "stream", v, sizeof v) > 0 && !strcmp(v, "true")) {
        follow_stream(s, req, rest);
        return;
    }
    const char *id = stored_id(s, req);
    char *obj = NULL;
    int rc = id ? resp_store_get(s->ctx.responses, id, &obj, NULL) : 0;
    if (!id) return;
    if (rc == ERR_NOT_FOUND) { /* deleted or pushed out since the check */
        stored_id(s, req);
        return;
    }
    if (rc) {
        http_respond_error(req->conn, 500, "out of memory", API_ERR_SERVER, NULL, NULL, NULL);
        return;
    }
    http_respond(req->conn, 200, "application/json", obj, strlen(obj), NULL);
    free(obj);
}

void server_handle_delete_response(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    const char *id = req->path + strlen(PREFIX);
    if (!s->ctx.responses || bg_delete(s->bg, id)) {
        not_found(s, req->conn, id, strlen(id));
        return;
    }
    char body[160];
    int n = snprintf(body, sizeof body, "{\"id\":\"%.64s\",\"object\":\"response\",\"deleted\":true}", id);
    http_respond(req->conn, 200, "application/json", body, (size_t)n, NULL);
}

/* bg_wait_fn: a cancel's answer, the cancelled response's final object. */
static void answer_cancel(void *wd, const char *obj)
{
    if (obj) http_reply_send(wd, 200, "application/json", obj, strlen(obj), NULL);
    else reply_error(wd, 500, API_ERR_SERVER, NULL, "out of memory formatting the response");
}

/* A cancel of a response that is not running: a background response already cancelled
 * gets its object again; any other answer is 400 saying why. */
static void cancel_stored(struct server *s, struct http_reply *r, const char *id)
{
    char *obj = NULL;
    int rc = resp_store_get(s->ctx.responses, id, &obj, NULL);
    cJSON *root = obj ? cJSON_Parse(obj) : NULL;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "status");
    bool background = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "background"));
    if (rc == ERR_NOT_FOUND)
        reply_error(r, 404, API_ERR_INVALID_REQUEST, "response_not_found", "Response with id '%.64s' not found.", id);
    else if (!root || !cJSON_IsString(st))
        reply_error(r, 500, API_ERR_SERVER, NULL, "out of memory");
    else if (!background)
        reply_error(r, 400, API_ERR_INVALID_REQUEST, NULL, "Cannot cancel a synchronous response.");
    else if (!strcmp(st->valuestring, "cancelled"))
        http_reply_send(r, 200, "application/json", obj, strlen(obj), NULL);
    else
        reply_error(r, 400, API_ERR_INVALID_REQUEST, NULL, "Cannot cancel a response that is already %s.",
                    st->valuestring);
    cJSON_Delete(root);
    free(obj);
}

void server_handle_response_action(void *ud, const struct http_request *req)
{
    struct server *s = ud;
    if (server_refuse_unless_ready(s, req)) return;
    const char *id = req->path + strlen(PREFIX), *slash = strchr(id, '/');
    if (!slash || strcmp(slash, "/cancel")) {
        http_respond_error(req->conn, 404, "no such route (POST /v1/responses/{id}/cancel is)",
                           API_ERR_INVALID_REQUEST, NULL, NULL, NULL);
        return;
    }
    char rid[128];
    size_t len = (size_t)(slash - id);
    if (!s->ctx.responses || len >= sizeof rid) {
        not_found(s, req->conn, id, len);
        return;
    }
    memcpy(rid, id, len);
    rid[len] = 0;
    struct http_reply *r = http_reply_defer(req->conn, false, NULL, NULL);
    if (!r) return; /* the HTTP layer answers 500 */
    int rc = bg_cancel(s->bg, rid, answer_cancel, r);
    if (rc == ERR_NOT_FOUND) cancel_stored(s, r, rid);
    else if (rc) reply_error(r, 500, API_ERR_SERVER, NULL, "out of memory");
}
