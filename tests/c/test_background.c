/* test_background.c — the registry of running background responses
 * (src/server/background.h): start stores the queued object, updates replace it, the end
 * stores the final one (with "cancelled" when a cancel came first) and answers every
 * waiting cancel; a delete removes the object at once and nothing of the job comes back;
 * a cancel or delete of an id that is not running leaves the caller to the store; and
 * threads cancelling, deleting and ending at once (run under TSan in `make tsan`) never
 * store a deleted response, never lose a waiter, and abort a job at most once.
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "api/response_store.h"
#include "server/background.h"
#include "util/err.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A stand-in job: how often it was aborted, and what its end makes. */
struct fake_job {
    atomic_int aborts;
    int finals;
    bool cancelled_seen;
    bool big;               /* its final object is larger than a small store's budget */
};

static void fake_abort(void *ud) { atomic_fetch_add(&((struct fake_job *)ud)->aborts, 1); }

static char *fake_final(void *ud, bool cancelled)
{
    struct fake_job *j = ud;
    j->finals++;
    j->cancelled_seen = cancelled;
    if (j->big) {
        char *b = malloc(400);
        if (b) {
            memset(b, 'x', 399);
            b[399] = 0;
        }
        return b;
    }
    return strdup(cancelled ? "{\"status\":\"cancelled\"}" : "{\"status\":\"completed\"}");
}

/* A waiting cancel: the object it was answered with. */
struct fake_waiter {
    atomic_int calls;
    char got[64];
};

static void fake_wait(void *wd, const char *response)
{
    struct fake_waiter *w = wd;
    snprintf(w->got, sizeof w->got, "%s", response ? response : "(null)");
    atomic_fetch_add(&w->calls, 1);
}

/* The stored object of id ("" when there is none). */
static const char *stored(struct resp_store *s, const char *id, char *buf, size_t cap)
{
    char *r = NULL;
    buf[0] = 0;
    if (resp_store_get(s, id, &r, NULL) == 0) snprintf(buf, cap, "%s", r);
    free(r);
    return buf;
}

static void test_life(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    struct bg_registry *r = bg_create(s);
    CHECK(s && r, "create");
    if (!s || !r) return;
    char buf[128];
    struct fake_job j = { 0 };
    CHECK(bg_start(r, "resp_a", "{\"status\":\"queued\"}", "[1]", fake_abort, &j) == 0, "start");
    CHECK(!strcmp(stored(s, "resp_a", buf, sizeof buf), "{\"status\":\"queued\"}"), "queued stored: %s", buf);
    CHECK(bg_running(r) == 1, "one running");
    CHECK(bg_start(r, "resp_a", "{}", "[]", fake_abort, &j) == ERR_INVALID, "the same id twice");
    bg_update(r, "resp_a", "{\"status\":\"in_progress\"}", "[1]");
    CHECK(!strcmp(stored(s, "resp_a", buf, sizeof buf), "{\"status\":\"in_progress\"}"), "update: %s", buf);
    CHECK(bg_end(r, "resp_a", fake_final, &j, "[1]") == 0, "end");
    CHECK(j.finals == 1 && !j.cancelled_seen && atomic_load(&j.aborts) == 0, "final, not cancelled");
    CHECK(!strcmp(stored(s, "resp_a", buf, sizeof buf), "{\"status\":\"completed\"}"), "final stored: %s", buf);
    char *items = NULL;
    CHECK(resp_store_get(s, "resp_a", NULL, &items) == 0 && items && !strcmp(items, "[1]"), "items kept");
    free(items);
    CHECK(bg_running(r) == 0, "none running");
    /* not running any more: cancel leaves it to the caller; delete removes the object */
    struct fake_waiter w = { 0 };
    CHECK(bg_cancel(r, "resp_a", fake_wait, &w) == ERR_NOT_FOUND && atomic_load(&w.calls) == 0, "cancel after end");
    CHECK(bg_delete(r, "resp_a") == 0 && !*stored(s, "resp_a", buf, sizeof buf), "delete after end");
    CHECK(bg_delete(r, "resp_a") == ERR_NOT_FOUND, "delete twice");
    CHECK(bg_cancel(r, "resp_zz", fake_wait, &w) == ERR_NOT_FOUND, "cancel unknown");
    bg_free(r);
    resp_store_free(s);
}

static void test_cancel(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    struct bg_registry *r = bg_create(s);
    char buf[128];
    struct fake_job j = { 0 };
    struct fake_waiter w1 = { 0 }, w2 = { 0 };
    CHECK(bg_start(r, "resp_c", "{\"status\":\"queued\"}", "[]", fake_abort, &j) == 0, "start");
    CHECK(bg_cancel(r, "resp_c", fake_wait, &w1) == 0 && bg_cancel(r, "resp_c", fake_wait, &w2) == 0, "cancel x2");
    CHECK(atomic_load(&j.aborts) == 1, "aborted once, not per cancel: %d", atomic_load(&j.aborts));
    CHECK(atomic_load(&w1.calls) == 0, "the cancel waits for the end");
    bg_end(r, "resp_c", fake_final, &j, "[]");
    CHECK(j.cancelled_seen, "the end knows it was cancelled");
    CHECK(atomic_load(&w1.calls) == 1 && atomic_load(&w2.calls) == 1, "both waiters answered");
    CHECK(!strcmp(w1.got, "{\"status\":\"cancelled\"}") && !strcmp(w2.got, w1.got), "with the final: %s", w1.got);
    CHECK(!strcmp(stored(s, "resp_c", buf, sizeof buf), w1.got), "which is stored");
    bg_free(r);
    resp_store_free(s);
}

static void test_delete_while_running(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    struct bg_registry *r = bg_create(s);
    char buf[128];
    struct fake_job j = { 0 };
    struct fake_waiter w = { 0 };
    CHECK(bg_start(r, "resp_d", "{\"status\":\"queued\"}", "[]", fake_abort, &j) == 0, "start");
    CHECK(bg_delete(r, "resp_d") == 0 && atomic_load(&j.aborts) == 1, "delete aborts");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "gone at once");
    bg_update(r, "resp_d", "{\"status\":\"in_progress\"}", "[]");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "an update does not bring it back");
    CHECK(bg_delete(r, "resp_d") == 0 && atomic_load(&j.aborts) == 1, "a second delete: no second abort");
    CHECK(bg_cancel(r, "resp_d", fake_wait, &w) == 0, "still running: a cancel waits");
    CHECK(bg_end(r, "resp_d", fake_final, &j, "[]") == 0, "end");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "nor does its end: %s", buf);
    CHECK(atomic_load(&w.calls) == 1 && !strcmp(w.got, "{\"status\":\"cancelled\"}"), "the waiter: %s", w.got);
    /* a running job whose stored object was pushed out is still deletable */
    CHECK(bg_start(r, "resp_e", "{}", "[]", fake_abort, &j) == 0, "start e");
    CHECK(resp_store_delete(s, "resp_e") == 0, "pushed out");
    CHECK(bg_delete(r, "resp_e") == 0, "delete of a running job without its object");
    bg_end(r, "resp_e", fake_final, &j, "[]");
    bg_free(r);
    resp_store_free(s);
}

static void test_store_limits(void)
{
    /* a budget too small for the queued object: nothing registered */
    struct resp_store *s = resp_store_create(300);
    struct bg_registry *r = bg_create(s);
    char big[400], buf[128];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    struct fake_job j = { .big = true };
    CHECK(bg_start(r, "resp_f", big, "[]", fake_abort, &j) == ERR_RANGE && bg_running(r) == 0, "too big");
    /* a final object too big: not kept, and the stale snapshot goes too (GET says 404,
       never "in_progress" for ever); a waiting cancel still gets it */
    struct fake_waiter w = { 0 };
    CHECK(bg_start(r, "resp_g", "{\"status\":\"queued\"}", "[]", fake_abort, &j) == 0, "start");
    CHECK(bg_cancel(r, "resp_g", fake_wait, &w) == 0, "cancel");
    CHECK(bg_end(r, "resp_g", fake_final, &j, "[]") == ERR_RANGE, "end: not kept");
    CHECK(!*stored(s, "resp_g", buf, sizeof buf), "no stale snapshot: %s", buf);
    CHECK(atomic_load(&w.calls) == 1 && w.got[0] == 'x', "the waiter has the object");
    bg_free(r);
    resp_store_free(s);
}

/* ------------------------------------------------------------------ threads */

#define N_JOBS 200

struct race {
    struct bg_registry *r;
    struct fake_job jobs[N_JOBS];
    struct fake_waiter waiters[N_JOBS];
    bool cancel_found[N_JOBS], delete_found[N_JOBS];
};

static void race_id(int i, char *id, size_t cap) { snprintf(id, cap, "resp_%04d", i); }

struct racer {
    struct race *x;
    int role; /* 0: ends every job, 1: cancels them, 2: deletes them */
};

static void *racer_main(void *arg)
{
    struct racer *rc = arg;
    struct race *x = rc->x;
    char id[32];
    for (int i = 0; i < N_JOBS; i++) {
        race_id(i, id, sizeof id);
        if (rc->role == 0) bg_end(x->r, id, fake_final, &x->jobs[i], "[]");
        else if (rc->role == 1) x->cancel_found[i] = bg_cancel(x->r, id, fake_wait, &x->waiters[i]) == 0;
        else x->delete_found[i] = bg_delete(x->r, id) == 0;
    }
    return NULL;
}

static void test_threads(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    struct race *x = calloc(1, sizeof *x);
    x->r = bg_create(s);
    char id[32];
    for (int i = 0; i < N_JOBS; i++) {
        race_id(i, id, sizeof id);
        CHECK(bg_start(x->r, id, "{\"status\":\"queued\"}", "[]", fake_abort, &x->jobs[i]) == 0, "start %d", i);
    }
    pthread_t t[3];
    struct racer rc[3];
    for (int k = 0; k < 3; k++) {
        rc[k] = (struct racer){ .x = x, .role = k };
        CHECK(pthread_create(&t[k], NULL, racer_main, &rc[k]) == 0, "thread %d", k);
    }
    for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
    CHECK(bg_running(x->r) == 0, "every job ended");
    int bad = 0;
    char buf[128];
    for (int i = 0; i < N_JOBS && bad < 5; i++) {
        race_id(i, id, sizeof id);
        const struct fake_job *j = &x->jobs[i];
        const struct fake_waiter *w = &x->waiters[i];
        stored(s, id, buf, sizeof buf);
        bool ok = j->finals == 1 && atomic_load(&j->aborts) <= 1;
        /* a cancel that found the job is answered with its final, which says cancelled */
        ok = ok && atomic_load(&w->calls) == (x->cancel_found[i] ? 1 : 0);
        ok = ok && (!x->cancel_found[i] || (j->cancelled_seen && !strcmp(w->got, "{\"status\":\"cancelled\"}")));
        /* a delete that came before the end leaves nothing; one after it removed the final */
        ok = ok && !*buf == (x->delete_found[i]);
        if (!ok) {
            bad++;
            CHECK(false, "%s: finals %d aborts %d waiter %d cancel %d delete %d stored '%s'", id, j->finals,
                  atomic_load(&j->aborts), atomic_load(&w->calls), x->cancel_found[i], x->delete_found[i], buf);
        }
    }
    bg_free(x->r);
    free(x);
    resp_store_free(s);
}

int main(void)
{
    RUN(test_life);
    RUN(test_cancel);
    RUN(test_delete_while_running);
    RUN(test_store_limits);
    RUN(test_threads);
    return test_summary();
}
