/* background.c — the registry of running background responses (background.h).
 *
 * A short list: a job is on it from bg_start to bg_end, and a server runs at most about
 * max-num-seqs of them at once, so lookups walk it. Waiting cancels and followers hang
 * off their job; a streamed job keeps every event it sent (a resumed stream replays them)
 * until bg_end.
 */
#define _POSIX_C_SOURCE 200809L
#include "server/background.h"

#include "api/response_store.h"
#include "util/err.h"
#include "util/grow.h"
#include "util/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct waiter {
    struct waiter *next;
    bg_wait_fn wait;
    void *wd;
};

struct follower {
    struct follower *next;
    void *fd;
};

struct bg_job {
    struct bg_job *next;
    char *id;
    bg_abort_fn abort;
    void *ud;
    bool cancelled, deleted;
    bool finished;                   /* bg_finish ran: too late to cancel */
    struct waiter *waiters;
    char *final;                     /* bg_finish's object, for the waiters */
    const struct bg_follower_ops *ops; /* streamed; NULL: not */
    struct follower *followers;
    char **events;                   /* [n_events] kept events, malloc'd each */
    size_t n_events, events_cap;
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

/* Adds a follower at the head; false on OOM. Caller holds mu. */
static bool add_follower(struct bg_job *j, void *fd)
{
    struct follower *f = malloc(sizeof *f);
    if (!f) return false;
    *f = (struct follower){ .next = j->followers, .fd = fd };
    j->followers = f;
    return true;
}

int bg_start(struct bg_registry *r, const char *id, const char *queued, const char *items, bg_abort_fn abort,
             void *ud, const struct bg_follower_ops *ops, void *first)
{
    struct bg_job *j = calloc(1, sizeof *j);
    if (!j || !(j->id = strdup(id)) || (first && !add_follower(j, first))) {
        if (j) free(j->id);
        free(j);
        return ERR_NOMEM;
    }
    j->abort = abort;
    j->ud = ud;
    j->ops = ops;
    pthread_mutex_lock(&r->mu);
    int rc = *find(r, id) ? ERR_INVALID : resp_store_put(r->store, id, queued, items);
    if (!rc) {
        j->next = r->jobs;
        r->jobs = j;
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) {
        free(j->followers);
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
    if (rc)
        LOG_WARN("server", "background response %s: snapshot not stored (%s)", id,
                 rc == ERR_RANGE ? "larger than --response-store-mb" : err_name(rc));
}

/* Writes ev to every follower of j; the ones whose client is gone are unlinked onto
 * *gone (the caller ends them outside the lock). Caller holds mu. */
static void write_followers(struct bg_job *j, const char *ev, size_t len, struct follower **gone)
{
    for (struct follower **p = &j->followers; *p;) {
        struct follower *f = *p;
        if (j->ops->write(f->fd, ev, len)) {
            p = &f->next;
            continue;
        }
        *p = f->next;
        f->next = *gone;
        *gone = f;
    }
}

/* Ends the followers of list and frees them. Without the lock. */
static void end_followers(const struct bg_follower_ops *ops, struct follower *list)
{
    for (struct follower *f = list, *next; f; f = next) {
        next = f->next;
        ops->end(f->fd);
        free(f);
    }
}

int bg_event(struct bg_registry *r, const char *id, const char *event, size_t len)
{
    struct follower *gone = NULL;
    const struct bg_follower_ops *ops = NULL;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    if (j && j->ops) {
        ops = j->ops;
        char *copy = malloc(len + 1);
        if (copy && grow_array((void **)&j->events, &j->events_cap, j->n_events + 1, sizeof *j->events)) {
            memcpy(copy, event, len);
            copy[len] = 0;
            j->events[j->n_events++] = copy;
        } else {
            free(copy);
            rc = ERR_NOMEM;
        }
        write_followers(j, event, len, &gone);
    }
    pthread_mutex_unlock(&r->mu);
    if (gone) end_followers(ops, gone);
    return rc;
}

int bg_finish(struct bg_registry *r, const char *id, bg_final_fn final, void *ud, const char *items)
{
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    char *obj = final(ud, j && j->cancelled);
    int rc = !obj ? ERR_NOMEM : j && j->deleted ? 0 : resp_store_put(r->store, id, obj, items);
    if (rc) resp_store_delete(r->store, id); /* not an "in_progress" snapshot for ever */
    if (j) {
        free(j->final);
        j->final = obj;
        j->finished = true;
    }
    pthread_mutex_unlock(&r->mu);
    if (!j) free(obj);
    return rc;
}

void bg_end(struct bg_registry *r, const char *id)
{
    pthread_mutex_lock(&r->mu);
    struct bg_job **slot = find(r, id), *j = *slot;
    if (j) {
        *slot = j->next;
        r->n--;
    }
    pthread_mutex_unlock(&r->mu);
    if (!j) return;
    /* answered outside the lock: they do I/O */
    if (j->ops) end_followers(j->ops, j->followers);
    for (struct waiter *w = j->waiters, *next; w; w = next) {
        next = w->next;
        w->wait(w->wd, j->final);
        free(w);
    }
    for (size_t i = 0; i < j->n_events; i++) free(j->events[i]);
    free(j->events);
    free(j->final);
    free(j->id);
    free(j);
}

int bg_cancel(struct bg_registry *r, const char *id, bg_wait_fn wait, void *wd)
{
    struct waiter *w = malloc(sizeof *w);
    if (!w) return ERR_NOMEM;
    *w = (struct waiter){ .wait = wait, .wd = wd };
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    /* after bg_finish the final object is stored: the caller answers from the store,
     * exactly as after bg_end (a completed response cannot be cancelled any more) */
    if (j && j->finished) j = NULL;
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

int bg_follow(struct bg_registry *r, const char *id, long starting_after, const struct bg_follower_ops *ops,
              void *fd)
{
    struct follower *f = malloc(sizeof *f);
    if (!f) return ERR_NOMEM;
    f->fd = fd;
    struct follower *gone = NULL;
    pthread_mutex_lock(&r->mu);
    struct bg_job *j = *find(r, id);
    int rc = !j ? ERR_NOT_FOUND : !j->ops ? ERR_UNSUPPORTED
             : starting_after < -1 || starting_after >= (long)j->n_events ? ERR_RANGE : 0;
    if (!rc) {
        ops->start(fd);
        bool live = true;
        for (size_t i = (size_t)(starting_after + 1); i < j->n_events && live; i++)
            live = ops->write(fd, j->events[i], strlen(j->events[i]));
        f->next = live ? j->followers : NULL;
        if (live) j->followers = f;
        else gone = f;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) free(f);
    if (gone) end_followers(ops, gone);
    return rc;
}

int bg_running(struct bg_registry *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}
