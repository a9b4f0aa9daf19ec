/* background.h — background responses (POST /v1/responses with "background": true): the
 * ones still running, by id, every store update about them, and — for a streamed one —
 * its events so far and the streams following them, so that a cancel, a delete or a
 * client resuming the stream never races with the job's own updates.
 *
 * The life of a background response:
 *   bg_start   the request was submitted: its "queued" object is stored (GET returns
 *              it) and the job is registered; a streamed one gets its first follower
 *              (the request's own stream)
 *   bg_update  a newer snapshot ("in_progress")
 *   bg_event   a streamed one's next event: kept, and written to every follower
 *   bg_follow  GET /v1/responses/{id}?stream=true&starting_after=N: a new follower gets
 *              the kept events after N, then the rest as they come
 *   bg_cancel  POST /v1/responses/{id}/cancel: the job is marked cancelled and its work
 *              aborted; the cancel's answer waits for the end (its waiter)
 *   bg_delete  DELETE /v1/responses/{id}: the stored object goes now; a running job is
 *              aborted and stores nothing more
 *   bg_finish  the job is over: its final object (status "cancelled" when a cancel came
 *              first) is stored unless deleted — before a streamed one's last event, so
 *              a client that sees that event finds the response stored
 *   bg_end     unregisters it: the followers' streams end, every waiting cancel gets the
 *              final object
 * The registry's mutex is held across each of these and the store calls they make, so a
 * delete is never undone by a late update and a cancel either reaches a running job or
 * finds its final object. Callers may hold their own job lock when they call bg_start,
 * bg_update, bg_event, bg_finish and bg_end (lock order: job, then registry, then
 * store); the callbacks (abort, the followers' write/start) run under the registry's
 * mutex and must not take a job lock or block.
 */
#ifndef TESSERA_SERVER_BACKGROUND_H
#define TESSERA_SERVER_BACKGROUND_H

#include <stdbool.h>
#include <stddef.h>

struct resp_store;
struct bg_registry;

/* Stops a running job's work (it will still reach bg_finish and bg_end). */
typedef void (*bg_abort_fn)(void *ud);
/* The job's final response object (malloc'd JSON text; NULL on OOM); cancelled: a cancel
 * came before the end. Called once, from bg_finish. */
typedef char *(*bg_final_fn)(void *ud, bool cancelled);
/* A waiting cancel's answer: the final object (NULL on OOM), borrowed for the call. */
typedef void (*bg_wait_fn)(void *wd, const char *response);

/* A stream following a streamed background response (fd: its reply). start: it is about
 * to get its first event (the caller turns it into a stream). write: one event; false when
 * the client is gone (the follower is dropped, and ended). end: no more events; called
 * exactly once per follower, outside the registry's mutex. */
struct bg_follower_ops {
    void (*start)(void *fd);
    bool (*write)(void *fd, const char *event, size_t len);
    void (*end)(void *fd);
};

/* A registry over store (borrowed; it must outlive the registry). NULL on OOM. */
struct bg_registry *bg_create(struct resp_store *store);
/* Frees r; no job may be registered any more. NULL is a no-op. */
void bg_free(struct bg_registry *r);

/* Stores the queued object of response id with its conversation items (as
 * resp_store_put) and registers the job (abort(ud) stops it). ops non-NULL: a streamed
 * one, whose events are kept for followers; first (may be NULL) is its first follower
 * (its start is not called: the caller's stream is already one). Returns 0, ERR_RANGE (the
 * object does not fit the store's budget), ERR_INVALID (id is running already) or
 * ERR_NOMEM; nothing is registered then, and first is not taken. */
int bg_start(struct bg_registry *r, const char *id, const char *queued, const char *items, bg_abort_fn abort,
             void *ud, const struct bg_follower_ops *ops, void *first);
/* Replaces id's stored object with response, unless it was deleted. A failure to store is
 * logged and otherwise ignored (GET shows the older snapshot or 404). */
void bg_update(struct bg_registry *r, const char *id, const char *response, const char *items);
/* A streamed job's next event (one SSE event; sequence numbers from 0, one per event):
 * kept and written to every follower. Returns 0 or ERR_NOMEM (not kept: a follower
 * joining later misses it; those following now still get it). */
int bg_event(struct bg_registry *r, const char *id, const char *event, size_t len);
/* Stores final(ud, cancelled) unless id was deleted, and keeps it for bg_end's waiters.
 * Returns 0, or the store's error (ERR_RANGE / ERR_NOMEM: not kept, and the older
 * snapshot is removed). */
int bg_finish(struct bg_registry *r, const char *id, bg_final_fn final, void *ud, const char *items);
/* Unregisters id: every follower is ended and every waiting cancel answered with the
 * object bg_finish made. */
void bg_end(struct bg_registry *r, const char *id);

/* id is running: marks it cancelled, aborts it, and queues wait(wd, final object) for its
 * end; returns 0. ERR_NOT_FOUND when id is not running or bg_finish already stored its
 * final object (the caller looks at the store); ERR_NOMEM. Any thread. */
int bg_cancel(struct bg_registry *r, const char *id, bg_wait_fn wait, void *wd);
/* Deletes id's stored object; if id is running, it is aborted and stores nothing more.
 * Returns 0, or ERR_NOT_FOUND (neither stored nor running). Any thread. */
int bg_delete(struct bg_registry *r, const char *id);
/* fd follows streamed response id from the event after sequence number starting_after
 * (-1: from the first): ops->start, the kept events after it, then the rest as they come
 * until bg_end. Returns 0; ERR_NOT_FOUND (id is not running), ERR_UNSUPPORTED (it is not
 * streamed), ERR_RANGE (starting_after is past its last event), ERR_NOMEM: fd untouched.
 * Any thread. */
int bg_follow(struct bg_registry *r, const char *id, long starting_after, const struct bg_follower_ops *ops,
              void *fd);
/* The number of running background responses. */
int bg_running(struct bg_registry *r);

#endif
