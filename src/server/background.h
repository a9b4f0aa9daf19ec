/* background.h — background responses (POST /v1/responses with "background": true): the
 * ones still running, by id, and every store update about them, so that a cancel or a
 * delete never races with the job's own updates.
 *
 * The life of a background response:
 *   bg_start   the request was submitted: its "queued" object is stored (GET returns
 *              it) and the job is registered; the client gets that object at once
 *   bg_update  a newer snapshot ("in_progress")
 *   bg_cancel  POST /v1/responses/{id}/cancel: the job is marked cancelled and its work
 *              aborted; the cancel's answer waits for the end (its waiter)
 *   bg_delete  DELETE /v1/responses/{id}: the stored object goes now; a running job is
 *              aborted and stores nothing more
 *   bg_end     the job is over: its final object (status "cancelled" when a cancel came
 *              first) is stored unless deleted, and every waiting cancel gets it
 * The registry's mutex is held across each of these and the store calls they make, so a
 * delete is never undone by a late update and a cancel either reaches a running job or
 * finds its final object. Callers may hold their own job lock when they call bg_start,
 * bg_update and bg_end (lock order: job, then registry, then store); the callbacks
 * abort and wait run under the registry's mutex and must not take a job lock.
 */
#ifndef TESSERA_SERVER_BACKGROUND_H
#define TESSERA_SERVER_BACKGROUND_H

#include <stdbool.h>

struct resp_store;
struct bg_registry;

/* Stops a running job's work (it will still reach bg_end). */
typedef void (*bg_abort_fn)(void *ud);
/* The job's final response object (malloc'd JSON text; NULL on OOM); cancelled: a cancel
 * came before the end. Called once, from bg_end. */
typedef char *(*bg_final_fn)(void *ud, bool cancelled);
/* A waiting cancel's answer: the final object (NULL on OOM), borrowed for the call. */
typedef void (*bg_wait_fn)(void *wd, const char *response);

/* A registry over store (borrowed; it must outlive the registry). NULL on OOM. */
struct bg_registry *bg_create(struct resp_store *store);
/* Frees r; no job may be registered any more. NULL is a no-op. */
void bg_free(struct bg_registry *r);

/* Stores the queued object of response id with its conversation items (as
 * resp_store_put) and registers the job (abort(ud) stops it). Returns 0, ERR_RANGE (the
 * object does not fit the store's budget), ERR_INVALID (id is running already) or
 * ERR_NOMEM; nothing is registered then. */
int bg_start(struct bg_registry *r, const char *id, const char *queued, const char *items, bg_abort_fn abort,
             void *ud);
/* Replaces id's stored object with response, unless it was deleted. A failure to store is
 * logged and otherwise ignored (GET shows the older snapshot or 404). */
void bg_update(struct bg_registry *r, const char *id, const char *response, const char *items);
/* Unregisters id, stores final(ud, cancelled) unless it was deleted, and answers every
 * waiting cancel with it. Returns 0, or the store's error (ERR_RANGE / ERR_NOMEM: not
 * kept, and the older snapshot is removed; the waiters still get the object, or NULL). */
int bg_end(struct bg_registry *r, const char *id, bg_final_fn final, void *ud, const char *items);

/* id is running: marks it cancelled, aborts it, and queues wait(wd, final object) for its
 * end; returns 0. ERR_NOT_FOUND when id is not running (the caller looks at the store);
 * ERR_NOMEM. Any thread. */
int bg_cancel(struct bg_registry *r, const char *id, bg_wait_fn wait, void *wd);
/* Deletes id's stored object; if id is running, it is aborted and stores nothing more.
 * Returns 0, or ERR_NOT_FOUND (neither stored nor running). Any thread. */
int bg_delete(struct bg_registry *r, const char *id);
/* The number of running background responses. */
int bg_running(struct bg_registry *r);

#endif
