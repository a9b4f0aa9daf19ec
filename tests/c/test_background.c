/* test_background.c — the registry of running background responses
 * (src/server/background.h): start stores the queued object, updates replace it, the end
 * stores the final one (with "cancelled" when a cancel came first) and answers every
 * waiting cancel; a delete removes the object at once and nothing of the job comes back;
 * a cancel or delete of an id that is not running leaves the caller to the store; a
 * streamed one's events reach every follower, a late follower gets the kept ones after
 * its sequence number first, a follower whose client went is dropped, and each stream
 * ends exactly once; and
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

/* bg_finish then bg_end, as a job ends; bg_finish's result. */
static int end_job(struct bg_registry *r, const char *id, struct fake_job *j, const char *items)
{
    int rc = bg_finish(r, id, fake_final, j, items);
    bg_end(r, id);
    return rc;
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
    CHECK(bg_start(r, "resp_a", "{\"status\":\"queued\"}", "[1]", fake_abort, &j, NULL, NULL) == 0, "start");
    CHECK(!strcmp(stored(s, "resp_a", buf, sizeof buf), "{\"status\":\"queued\"}"), "queued stored: %s", buf);
    CHECK(bg_running(r) == 1, "one running");
    CHECK(bg_start(r, "resp_a", "{}", "[]", fake_abort, &j, NULL, NULL) == ERR_INVALID, "the same id twice");
    bg_update(r, "resp_a", "{\"status\":\"in_progress\"}", "[1]");
    CHECK(!strcmp(stored(s, "resp_a", buf, sizeof buf), "{\"status\":\"in_progress\"}"), "update: %s", buf);
    CHECK(end_job(r, "resp_a", &j, "[1]") == 0, "end");
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
    CHECK(bg_start(r, "resp_c", "{\"status\":\"queued\"}", "[]", fake_abort, &j, NULL, NULL) == 0, "start");
    CHECK(bg_cancel(r, "resp_c", fake_wait, &w1) == 0 && bg_cancel(r, "resp_c", fake_wait, &w2) == 0, "cancel x2");
    CHECK(atomic_load(&j.aborts) == 1, "aborted once, not per cancel: %d", atomic_load(&j.aborts));
    CHECK(atomic_load(&w1.calls) == 0, "the cancel waits for the end");
    end_job(r, "resp_c", &j, "[]");
    CHECK(j.cancelled_seen, "the end knows it was cancelled");
    CHECK(atomic_load(&w1.calls) == 1 && atomic_load(&w2.calls) == 1, "both waiters answered");
    CHECK(!strcmp(w1.got, "{\"status\":\"cancelled\"}") && !strcmp(w2.got, w1.got), "with the final: %s", w1.got);
    CHECK(!strcmp(stored(s, "resp_c", buf, sizeof buf), w1.got), "which is stored");
    /* a cancel between the end's two halves (final stored, not yet unregistered) is too
     * late, as one after the end: left to the caller, no abort, no waiter */
    struct fake_job k = { 0 };
    struct fake_waiter w3 = { 0 };
    CHECK(bg_start(r, "resp_f", "{\"status\":\"queued\"}", "[]", fake_abort, &k, NULL, NULL) == 0, "start f");
    CHECK(bg_finish(r, "resp_f", fake_final, &k, "[]") == 0, "finish f");
    CHECK(bg_cancel(r, "resp_f", fake_wait, &w3) == ERR_NOT_FOUND, "a cancel after the final is stored");
    bg_end(r, "resp_f");
    CHECK(atomic_load(&k.aborts) == 0 && atomic_load(&w3.calls) == 0 && !k.cancelled_seen, "not cancelled");
    CHECK(!strcmp(stored(s, "resp_f", buf, sizeof buf), "{\"status\":\"completed\"}"), "completed: %s", buf);
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
    CHECK(bg_start(r, "resp_d", "{\"status\":\"queued\"}", "[]", fake_abort, &j, NULL, NULL) == 0, "start");
    CHECK(bg_delete(r, "resp_d") == 0 && atomic_load(&j.aborts) == 1, "delete aborts");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "gone at once");
    bg_update(r, "resp_d", "{\"status\":\"in_progress\"}", "[]");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "an update does not bring it back");
    CHECK(bg_delete(r, "resp_d") == 0 && atomic_load(&j.aborts) == 1, "a second delete: no second abort");
    CHECK(bg_cancel(r, "resp_d", fake_wait, &w) == 0, "still running: a cancel waits");
    CHECK(end_job(r, "resp_d", &j, "[]") == 0, "end");
    CHECK(!*stored(s, "resp_d", buf, sizeof buf), "nor does its end: %s", buf);
    CHECK(atomic_load(&w.calls) == 1 && !strcmp(w.got, "{\"status\":\"cancelled\"}"), "the waiter: %s", w.got);
    /* a running job whose stored object was pushed out is still deletable */
    CHECK(bg_start(r, "resp_e", "{}", "[]", fake_abort, &j, NULL, NULL) == 0, "start e");
    CHECK(resp_store_delete(s, "resp_e") == 0, "pushed out");
    CHECK(bg_delete(r, "resp_e") == 0, "delete of a running job without its object");
    end_job(r, "resp_e", &j, "[]");
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
    CHECK(bg_start(r, "resp_f", big, "[]", fake_abort, &j, NULL, NULL) == ERR_RANGE && bg_running(r) == 0, "too big");
    /* a final object too big: not kept, and the stale snapshot goes too (GET says 404,
       never "in_progress" for ever); a waiting cancel still gets it */
    struct fake_waiter w = { 0 };
    CHECK(bg_start(r, "resp_g", "{\"status\":\"queued\"}", "[]", fake_abort, &j, NULL, NULL) == 0, "start");
    CHECK(bg_cancel(r, "resp_g", fake_wait, &w) == 0, "cancel");
    CHECK(end_job(r, "resp_g", &j, "[]") == ERR_RANGE, "end: not kept");
    CHECK(!*stored(s, "resp_g", buf, sizeof buf), "no stale snapshot: %s", buf);
    CHECK(atomic_load(&w.calls) == 1 && w.got[0] == 'x', "the waiter has the object");
    bg_free(r);
    resp_store_free(s);
}

/* ------------------------------------------------------------------ streamed */

/* A stand-in stream: what it got, whether it was started and how often ended. */
struct fake_stream {
    char got[256];
    size_t len;
    int events;
    bool alive;          /* false: the client is gone, writes fail */
    atomic_int starts, ends;
};

static void fs_start(void *fd) { atomic_fetch_add(&((struct fake_stream *)fd)->starts, 1); }

static bool fs_write(void *fd, const char *ev, size_t len)
{
    struct fake_stream *f = fd;
    if (!f->alive) return false;
    if (f->len + len < sizeof f->got) {
        memcpy(f->got + f->len, ev, len);
        f->len += len;
        f->got[f->len] = 0;
    }
    f->events++;
    return true;
}

static void fs_end(void *fd) { atomic_fetch_add(&((struct fake_stream *)fd)->ends, 1); }

static const struct bg_follower_ops FS = { fs_start, fs_write, fs_end };

static void test_followers(void)
{
    struct resp_store *s = resp_store_create(1 << 20);
    struct bg_registry *r = bg_create(s);
    struct fake_job j = { 0 };
    struct fake_stream a = { .alive = true }, b = { .alive = true }, c = { .alive = true }, d = { .alive = true };
    CHECK(bg_start(r, "resp_s", "{}", "[]", fake_abort, &j, &FS, &a) == 0, "start streamed, a following");
    CHECK(bg_event(r, "resp_s", "e0;", 3) == 0 && bg_event(r, "resp_s", "e1;", 3) == 0 &&
              bg_event(r, "resp_s", "e2;", 3) == 0, "events");
    CHECK(!strcmp(a.got, "e0;e1;e2;") && atomic_load(&a.starts) == 0, "the first follower: %s", a.got);
    /* joining: from the start, and after sequence number 1 */
    CHECK(bg_follow(r, "resp_s", -1, &FS, &b) == 0 && !strcmp(b.got, "e0;e1;e2;") && atomic_load(&b.starts) == 1,
          "replayed from the start: %s", b.got);
    CHECK(bg_follow(r, "resp_s", 1, &FS, &c) == 0 && !strcmp(c.got, "e2;"), "after 1: %s", c.got);
    CHECK(bg_follow(r, "resp_s", 2, &FS, &d) == 0 && d.len == 0 && atomic_load(&d.starts) == 1,
          "after the last: nothing yet, but following");
    struct fake_stream x = { .alive = true };
    CHECK(bg_follow(r, "resp_s", 3, &FS, &x) == ERR_RANGE && atomic_load(&x.starts) == 0, "past the last");
    CHECK(bg_follow(r, "resp_s", -2, &FS, &x) == ERR_RANGE, "before the first");
    /* a follower whose client went: dropped and ended once; the others go on */
    a.alive = false;
    CHECK(bg_event(r, "resp_s", "e3;", 3) == 0, "e3");
    CHECK(atomic_load(&a.ends) == 1 && !strcmp(b.got, "e0;e1;e2;e3;") && !strcmp(c.got, "e2;e3;") &&
              !strcmp(d.got, "e3;"), "after a left: %s | %s | %s", b.got, c.got, d.got);
    CHECK(bg_event(r, "resp_s", "e4;", 3) == 0 && atomic_load(&a.ends) == 1 && a.events == 3, "a hears no more");
    /* a follower gone during its replay is ended at once */
    struct fake_stream y = { .alive = false };
    CHECK(bg_follow(r, "resp_s", -1, &FS, &y) == 0 && atomic_load(&y.ends) == 1, "gone while replaying");
    /* the end: stored first, the last event, then every stream ends once */
    CHECK(bg_finish(r, "resp_s", fake_final, &j, "[]") == 0, "finish");
    CHECK(bg_event(r, "resp_s", "last;", 5) == 0, "the last event after the final object is stored");
    bg_end(r, "resp_s");
    CHECK(atomic_load(&b.ends) == 1 && atomic_load(&c.ends) == 1 && atomic_load(&d.ends) == 1 &&
              atomic_load(&a.ends) == 1, "every stream ended once");
    CHECK(!strcmp(d.got, "e3;e4;last;"), "d: %s", d.got);
    CHECK(bg_follow(r, "resp_s", -1, &FS, &x) == ERR_NOT_FOUND && bg_event(r, "resp_s", "z", 1) == 0,
          "after the end: not running");
    /* a job that is not streamed cannot be followed */
    CHECK(bg_start(r, "resp_n", "{}", "[]", fake_abort, &j, NULL, NULL) == 0, "start plain");
    CHECK(bg_follow(r, "resp_n", -1, &FS, &x) == ERR_UNSUPPORTED && atomic_load(&x.starts) == 0, "not streamed");
    end_job(r, "resp_n", &j, "[]");
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
    struct fake_stream streams[N_JOBS];
    int follow_rc[N_JOBS];
};

static void race_id(int i, char *id, size_t cap) { snprintf(id, cap, "resp_%04d", i); }

struct racer {
    struct race *x;
    int role; /* 0: sends two events and ends every job, 1: cancels them, 2: deletes them,
                 3: follows their streams */
};

static void *racer_main(void *arg)
{
    struct racer *rc = arg;
    struct race *x = rc->x;
    char id[32];
    for (int i = 0; i < N_JOBS; i++) {
        race_id(i, id, sizeof id);
        if (rc->role == 0) {
            bg_event(x->r, id, "a;", 2);
            bg_event(x->r, id, "b;", 2);
            end_job(x->r, id, &x->jobs[i], "[]");
        } else if (rc->role == 3) {
            x->streams[i].alive = true;
            x->follow_rc[i] = bg_follow(x->r, id, -1, &FS, &x->streams[i]);
        }
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
        CHECK(bg_start(x->r, id, "{\"status\":\"queued\"}", "[]", fake_abort, &x->jobs[i], &FS, NULL) == 0,
              "start %d", i);
    }
    pthread_t t[4];
    struct racer rc[4];
    for (int k = 0; k < 4; k++) {
        rc[k] = (struct racer){ .x = x, .role = k };
        CHECK(pthread_create(&t[k], NULL, racer_main, &rc[k]) == 0, "thread %d", k);
    }
    for (int k = 0; k < 4; k++) pthread_join(t[k], NULL);
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
        /* a stream that joined was started, got the events from the first, and ended once */
        const struct fake_stream *f = &x->streams[i];
        int fr = x->follow_rc[i];
        ok = ok && (fr == 0 ? atomic_load(&f->starts) == 1 && atomic_load(&f->ends) == 1 && !strcmp(f->got, "a;b;")
                            : fr == ERR_NOT_FOUND && atomic_load(&f->starts) == 0 && atomic_load(&f->ends) == 0);
        if (!ok) {
            bad++;
            CHECK(false, "%s: finals %d aborts %d waiter %d cancel %d delete %d stored '%s' follow %d '%s' %d/%d", id,
                  j->finals, atomic_load(&j->aborts), atomic_load(&w->calls), x->cancel_found[i], x->delete_found[i],
                  buf, fr, f->got, atomic_load(&f->starts), atomic_load(&f->ends));
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
    RUN(test_followers);
    RUN(test_threads);
    return test_summary();
}
