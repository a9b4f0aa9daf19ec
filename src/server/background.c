/* background.c — the registry of running background responses (background.h).
 *
 * A short list: a job is on it from bg_start to bg_end, and a server runs at most about
 * max-num-seqs of them at once, so lookups walk it. Waiting cancels hang off their job.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/background.h"

#include "api/response_store.h"
#include "util/err.h"
#include "util/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct waiter {
    struct waiter *next;
    bg_wait_fn wait;
    void *wd;
};

struct bg_job {
    struct bg_job *next;
    char *id;
    bg_abort_fn abort;
    void *ud;
    bool cancelled, deleted;
    struct waiter *waiters;
};

struct bg_registry {
    pthread_mutex_t mu;        /* guards jobs and every store call made here */
    struct resp_store *store;  /* borrowed */
    struct bg_job *jobs;
    int n;
};

struct bg_registry *bg_create(struct resp_store *store)
{
    struct bg_registry *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->store = store;
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

void bg_free(struct bg_registry *r)
{
    if (!r) return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The slot pointing at id's job, or at NULL. Caller holds mu. */
static struct bg_job **find(struct bg_registry *r, const char *id)
{
    struct bg_job **p = &r->jobs;
    while (*p && strcmp((*p)->id, id)) p = &(*p)->next;
    return p;
}

int bg_start(struct bg_registry *r, const char *id, const char *queued, const char *items, bg_abort_fn abort,
             void *ud)
{
    struct bg_job *j = calloc(1, sizeof *j);
    if (!j || !(j->id = strdup(id))) {
        free(j);
        return ERR_NOMEM;
    }
    j->abort = abort;
    j->ud = ud;
    pthread_mutex_lock(&r->mu);
    int rc = *find(r, id) ? ERR_INVALID : resp_store_put(r->store, id, queued, items);
    if (!rc) {
        j->next = r->jobs;
        r->jobs = j;
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) {
        free(j->id);
        free(j);
    }
    return rc;
}

void bg_update(struct bg_registry *r, const char *id, const char *response, const char *items)
{
    pthread_mutex_lock(&r->mu);
    const struct bg_job *j = *find(r, id);
    int rc = j && !j->deleted ? resp_store_put(r->store, id, response, items) : 0;
    pthread_mutex_unlock(&r->mu);
    if (rc) LOG_WARN("server", "background response %s: snapshot not stored (%s)", id,
                      rc == ERR_RANGE ? "larger than --response-store-mb" : err_name(rc));
}

int bg_end(struct bg_registry *r, const char *id, bg_final_fn final, void *ud, const char *items)
{
    pthread_mutex_lock(&r->mu);
    struct bg_job **slot = find(r, id), *j = *slot;
    bool cancelled = j && j->cancelled, deleted = j && j->deleted;
    if (j) {
        *slot = j->next;
        r->n--;
    }
    char *obj = final(ud, cancelled);
    int rc = !obj ? ERR_NOMEM : deleted ? 0 : resp_store_put(r->store, id, obj, items);
    if (rc) resp_store_delete(r->store, id); /* not an "in_progress" snapshot for ever */
    pthread_mutex_unlock(&r->mu);
    /* the waiters are answered outside the lock: they may do I/O */
    for (struct waiter *w = j ? j->waiters : NULL, *next; w; w = next) {
        next = w->next;
        w->wait(w->wd, obj);
        free(w);
    }
    free(obj);
    if (j) free(j->id);
    free(j);
    return rc;
}

int bg_cancel(struct bg_registry *r, const char *id, bg_wait_fn wait, void *wd)
{
    struct waiter *w = malloc(sizeof *w);
    if (!w) return ERR_NOMEM;
    *w = (struct waiter){ .wait = wait, .wd = wd };
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    if (j) {
        w->next = j->waiters;
        j->waiters = w;
        if (!j->cancelled && !j->deleted) j->abort(j->ud);
        j->cancelled = true;
    }
    pthread_mutex_unlock(&r->mu);
    if (j) return 0;
    free(w);
    return ERR_NOT_FOUND;
}

int bg_delete(struct bg_registry *r, const char *id)
{
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    int rc = resp_store_delete(r->store, id);
    if (j) {
        if (!j->deleted && !j->cancelled) j->abort(j->ud);
        j->deleted = true;
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int bg_running(struct bg_registry *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}
