/* engine.c — the scheduler thread and the thread-safe request API (see engine.h).
 *
 * Threads and locks:
 *   - e->mu guards the inbox (submitted requests not yet seen by the scheduler thread),
 *     the queue counters, the draining / stopping / failed flags and the debug-check
 *     handshake; e->cv wakes the scheduler thread, e->check_cv the debug checker.
 *   - r->mu guards a request's pending output and its state fields (r->pend); r->cv wakes
 *     request_wait. Lock order: r->mu before e->mu (request_abort); the scheduler thread
 *     never holds both.
 *   - Everything else in struct engine / struct request marked "scheduler thread" is only
 *     touched by the scheduler thread (or by engine_free after joining it).
 * Each loop of the scheduler thread: sleep until there is work → take the inbox (an
 * already aborted request finishes ABORT without reaching the scheduler) → turn pending
 * aborts into sched_abort → one sched_step whose callback detokenizes, matches stop
 * strings and appends output → statistics → for each request touched in this loop:
 * broadcast r->cv, call notify once (no lock held), and drop the engine's reference once
 * the request is finished, notified and gone from the scheduler.
 *
 * Memory: a request's buffers (pending text / ids / logprobs) grow geometrically and the
 * consumer's buffers are swapped in by request_take, so both sides reach a high-water mark
 * and are reused; the lists are intrusive. In steady state a step allocates nothing.
 */
#define _POSIX_C_SOURCE 200809L
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/grow.h"
#include "util/log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct request {
    /* immutable after engine_submit */
    struct engine *e;
    int64_t id;
    int32_t *prompt;             /* [n_prompt] */
    int n_prompt;
    struct sched_seq_params sp;  /* bias / salt point at the copies below; user = this */
    int32_t *bias_ids;           /* [sp.n_bias] */
    float *bias;                 /* [sp.n_bias] */
    int32_t *allowed_ids;        /* [sp.n_allowed] */
    int32_t *bad_words;          /* [sp.bad_words_len] */
    char salt[BM_SALT_MAX];
    bool skip_special;
    bool include_stop;           /* include_stop_str: a matched stop string is output */
    req_notify_fn notify;
    void *ud;
    double t_submit;             /* monotonic seconds */
    atomic_int refs;
    atomic_bool abort_flag;      /* request_abort was called */

    /* inbox link, under e->mu */
    struct request *inbox_next;

    /* scheduler thread */
    struct request *prev, *next; /* live list: taken from the inbox, engine ref held */
    struct request *touch_next;  /* touched in this loop */
    bool touched, news;          /* news: new output or finish since the last notify */
    bool in_sched;               /* a sequence in the scheduler (until its final event) */
    bool sched_aborted;          /* sched_abort called */
    bool dequeued;               /* left the queue counters (admitted or finished), or
                                    never in them (a sibling choice) */
    bool had_token, done;        /* done: finish set (mirror of pend.finish) */
    int n_gen;                   /* tokens generated so far (min_tokens' count) */
    int n_cached;                /* prompt tokens cached at the first admission */
    bool was_admitted;           /* the first admission happened (readmissions after a
                                    preemption leave n_cached and the queue time alone) */
    int64_t seq_id;
    double t_last_token;
    struct tok_stream ts;
    struct stop_matcher stop;

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct req_output pend;      /* pending buffers + current state */
};

struct engine {
    const struct model *m;       /* borrowed */
    struct engine_config cfg;
    struct sched *s;             /* scheduler thread (and create / free) */
    struct stats stats;
    pthread_t thread;
    bool thread_started;

    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* work for the scheduler thread */
    pthread_cond_t check_cv;     /* debug check done */
    struct request *inbox_head, *inbox_tail;
    int n_inbox;
    int n_queued;                /* submitted, not yet admitted nor finished */
    int64_t queued_tokens;       /* their prompt tokens */
    int n_active;                /* submitted, not yet finished */
    int64_t next_id;
    bool draining, stopping, failed, thread_done;
    atomic_bool failed_flag;     /* mirror of failed, read lock-free by engine_failed */
    bool abort_all;              /* engine_abort_all: abort every live request */
    bool check_req;
    int check_rc;
    char check_err[ERR_BUF];
    struct sched_stats check_st;
    atomic_bool abort_pending;   /* some request_abort since the last scan */

    /* scheduler thread */
    struct request *live;        /* head of the live list */
    struct request *touched;     /* head of the touched list */
    char *piece;                 /* [piece_cap] one token's text */
    int piece_cap;
    char *stop_out;              /* [piece_cap + STOP_MAX_LEN] stop matcher output */
    uint64_t seen_preemptions, seen_queries, seen_hits;
    uint64_t seen_drafts, seen_draft_tokens, seen_accepted;
    char fail_msg[ERR_BUF + 32];
    double last_tick;            /* monotonic seconds of the last cfg.tick call */
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- requests: params, output buffers, refcount -------------------------------------- */

void req_params_default(struct req_params *p)
{
    memset(p, 0, sizeof *p);
    sampler_params_default(&p->sp);
    p->skip_special_tokens = true;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
}

void req_output_free(struct req_output *o)
{
    if (!o) return;
    free(o->text);
    free(o->ids);
    free(o->lp);
    free(o->plp);
    memset(o, 0, sizeof *o);
}

static void request_destroy(struct request *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    req_output_free(&r->pend);
    free(r->prompt);
    free(r->allowed_ids);
    free(r->bad_words);
    free(r->bias_ids);
    free(r->bias);
    grammar_unref(r->sp.grammar);
    free(r);
}

void request_release(struct request *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) request_destroy(r);
}

int64_t request_id(const struct request *r) { return r->id; }

static void copy_logprob(struct req_logprob *d, const struct sched_logprob *lp)
{
    d->token = lp->token;
    d->logprob = lp->logprob;
    d->rank = lp->rank;
    d->n_top = lp->n_top;
    memcpy(d->top_ids, lp->top_ids, sizeof d->top_ids[0] * (size_t)lp->n_top);
    memcpy(d->top_logprobs, lp->top_logprobs, sizeof d->top_logprobs[0] * (size_t)lp->n_top);
}

/* Appends one prompt token's logprob to r->pend (caller holds r->mu). False on OOM. */
static bool pend_append_prompt(struct request *r, const struct sched_logprob *lp)
{
    struct req_output *o = &r->pend;
    size_t cap = (size_t)o->plp_cap;
    void *a = o->plp;
    bool ok = grow_array(&a, &cap, (size_t)o->n_plp + 1, sizeof *o->plp);
    o->plp = a;
    o->plp_cap = (int)cap;
    if (ok) copy_logprob(&o->plp[o->n_plp++], lp);
    return ok;
}

/* Appends one token's output to r->pend (caller holds r->mu). False on OOM (nothing
 * appended). */
static bool pend_append(struct request *r, int32_t token, const struct sched_logprob *lp,
                        const char *text, size_t len)
{
    struct req_output *o = &r->pend;
    size_t ids_cap = (size_t)o->ids_cap, lp_cap = (size_t)o->lp_cap;
    void *ids = o->ids, *lps = o->lp, *txt = o->text;
    bool ok = grow_array(&txt, &o->text_cap, o->text_len + len, 1);
    o->text = txt;
    if (token >= 0) {
        ok = ok && grow_array(&ids, &ids_cap, (size_t)o->n_ids + 1, sizeof *o->ids);
        o->ids = ids;
        o->ids_cap = (int)ids_cap;
        if (lp) {
            ok = ok && grow_array(&lps, &lp_cap, (size_t)o->n_lp + 1, sizeof *o->lp);
            o->lp = lps;
            o->lp_cap = (int)lp_cap;
        }
    }
    if (!ok) return false;
    if (len) memcpy(o->text + o->text_len, text, len);
    o->text_len += len;
    if (token >= 0) {
        o->ids[o->n_ids++] = token;
        o->n_generated++;
        if (lp) copy_logprob(&o->lp[o->n_lp++], lp);
    }
    return true;
}

bool request_take(struct request *r, struct req_output *o)
{
    pthread_mutex_lock(&r->mu);
    struct req_output *p = &r->pend;
    bool any = p->text_len || p->n_ids || p->n_lp || p->n_plp || p->finish != REQ_FINISH_NONE;
    char *t = o->text;
    size_t tc = o->text_cap;
    o->text = p->text, o->text_cap = p->text_cap, o->text_len = p->text_len;
    p->text = t, p->text_cap = tc, p->text_len = 0;
    int32_t *ids = o->ids;
    int ic = o->ids_cap;
    o->ids = p->ids, o->ids_cap = p->ids_cap, o->n_ids = p->n_ids;
    p->ids = ids, p->ids_cap = ic, p->n_ids = 0;
    struct req_logprob *lp = o->lp;
    int lc = o->lp_cap;
    o->lp = p->lp, o->lp_cap = p->lp_cap, o->n_lp = p->n_lp;
    p->lp = lp, p->lp_cap = lc, p->n_lp = 0;
    struct req_logprob *plp = o->plp;
    int pc = o->plp_cap;
    o->plp = p->plp, o->plp_cap = p->plp_cap, o->n_plp = p->n_plp;
    p->plp = plp, p->plp_cap = pc, p->n_plp = 0;
    o->finish = p->finish;
    o->stop_index = p->stop_index;
    o->n_prompt = p->n_prompt;
    o->n_cached = p->n_cached;
    o->n_generated = p->n_generated;
    o->t_first_token = p->t_first_token;
    o->t_total = p->t_total;
    memcpy(o->error, p->error, sizeof o->error);
    o->request_error = p->request_error;
    pthread_mutex_unlock(&r->mu);
    return any;
}

bool request_wait(struct request *r, double timeout_s)
{
    struct timespec dl;
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        double ns = (double)dl.tv_nsec + timeout_s * 1e9;
        dl.tv_sec += (time_t)(ns / 1e9);
        dl.tv_nsec = (long)fmod(ns, 1e9);
    }
    pthread_mutex_lock(&r->mu);
    const struct req_output *p = &r->pend;
    for (;;) {
        if (p->text_len || p->n_ids || p->finish != REQ_FINISH_NONE) break;
        if (timeout_s < 0) pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT) break;
    }
    bool ready = p->text_len || p->n_ids || p->finish != REQ_FINISH_NONE;
    pthread_mutex_unlock(&r->mu);
    return ready;
}

void request_abort(struct request *r)
{
    /* r->mu is held across the engine signal: if the request is not finished yet, the
     * engine cannot have finished it (that takes r->mu), so e is still alive */
    pthread_mutex_lock(&r->mu);
    if (r->pend.finish == REQ_FINISH_NONE && !atomic_exchange(&r->abort_flag, true)) {
        struct engine *e = r->e;
        pthread_mutex_lock(&e->mu);
        atomic_store(&e->abort_pending, true);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- scheduler thread: lists, finish, notify ----------------------------------------- */

static void live_insert(struct engine *e, struct request *r)
{
    r->prev = NULL;
    r->next = e->live;
    if (e->live) e->live->prev = r;
    e->live = r;
}

static void live_remove(struct engine *e, struct request *r)
{
    if (r->prev) r->prev->next = r->next;
    else e->live = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

static void touch(struct engine *e, struct request *r)
{
    if (r->touched) return;
    r->touched = true;
    r->touch_next = e->touched;
    e->touched = r;
}

/* Removes r from the queue counters (first admission, or finish before it). */
static void dequeue(struct engine *e, struct request *r)
{
    if (r->dequeued) return;
    r->dequeued = true;
    pthread_mutex_lock(&e->mu);
    e->n_queued--;
    e->queued_tokens -= r->n_prompt;
    pthread_mutex_unlock(&e->mu);
}

/* Sets r's finish (once); the final notify follows at the end of the loop. */
static void finish(struct engine *e, struct request *r, enum req_finish f, int stop_index,
                   const char *msg)
{
    if (r->done) return;
    r->done = true;
    double t = now_s() - r->t_submit;
    pthread_mutex_lock(&r->mu);
    r->pend.finish = f;
    r->pend.stop_index = stop_index;
    r->pend.t_total = t;
    if (msg) snprintf(r->pend.error, sizeof r->pend.error, "%s", msg);
    pthread_mutex_unlock(&r->mu);
    r->news = true;
    touch(e, r);
    dequeue(e, r);
    pthread_mutex_lock(&e->mu);
    e->n_active--;
    pthread_mutex_unlock(&e->mu);
    stats_add_finished(&e->stats, f == REQ_FINISH_STOP     ? STATS_FINISH_STOP
                                  : f == REQ_FINISH_LENGTH ? STATS_FINISH_LENGTH
                                  : f == REQ_FINISH_ERROR  ? STATS_FINISH_ERROR
                                                           : STATS_FINISH_ABORT);
    stats_observe(&e->stats, HIST_E2E, t);
    if (f == REQ_FINISH_ERROR) LOG_WARN("engine", "req %lld failed: %s", (long long)r->id, msg);
    else LOG_DEBUG("engine", "req %lld finished (%d) after %d tokens", (long long)r->id, (int)f,
                   r->pend.n_generated);
}

/* For every touched request: wake waiters, notify once (no lock held), and drop the
 * engine's reference when it is finished and gone from the scheduler. */
static void notify_touched(struct engine *e)
{
    struct request *r;
    while ((r = e->touched)) {
        e->touched = r->touch_next;
        r->touched = false;
        if (r->news) {
            r->news = false;
            pthread_mutex_lock(&r->mu);
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            if (r->notify) r->notify(r->ud);
        }
        if (r->done && !r->in_sched) {
            live_remove(e, r);
            request_release(r);
        }
    }
}

/* Finishes every live request with f (shutdown, engine failure): nothing will step them
 * again, so they leave the scheduler's books here too. */
static void finish_all(struct engine *e, enum req_finish f, const char *msg)
{
    for (struct request *r = e->live; r; r = r->next) {
        finish(e, r, f, -1, msg);
        r->in_sched = false;
        touch(e, r);
    }
    notify_touched(e);
}

/* ---- scheduler thread: step output --------------------------------------------------- */

/* Passes text through r's stop matcher into e->stop_out; returns STOP_HIT or
 * STOP_CONTINUE and the emittable byte count in *n_out. Within the first min_tokens tokens
 * the text passes unmatched (the matcher holds nothing then). With include_stop, a stop string
 * that completed follows the text before it (its bytes came from the held tail and this
 * text, so it fits where they did). */
static int stop_pass(struct engine *e, struct request *r, const char *text, size_t len,
                     size_t *n_out)
{
    if (r->n_gen <= r->sp.min_tokens) { /* stop strings are matched only after min_tokens */
        memcpy(e->stop_out, text, len);
        *n_out = len;
        return STOP_CONTINUE;
    }
    *n_out = 0;
    int rc = stop_feed(&r->stop, text, len, e->stop_out, (size_t)e->piece_cap + STOP_MAX_LEN,
                       n_out);
    if (rc != STOP_HIT) return STOP_CONTINUE;
    if (r->include_stop) {
        size_t n;
        const char *s = stop_matched_str(&r->stop, &n);
        memcpy(e->stop_out + *n_out, s, n);
        *n_out += n;
    }
    return STOP_HIT;
}

/* The first admission sets the queue time and the cached prompt tokens (vLLM's
 * num_cached_tokens): a readmission after a preemption finds the request's own blocks in
 * the cache, which says nothing about the prompt. */
static void on_admitted(struct engine *e, struct request *r, int n_cached)
{
    if (r->was_admitted) return;
    r->was_admitted = true;
    stats_observe(&e->stats, HIST_QUEUE, now_s() - r->t_submit);
    dequeue(e, r);
    r->n_cached = n_cached < r->n_prompt ? n_cached : r->n_prompt;
    pthread_mutex_lock(&r->mu);
    r->pend.n_cached = r->n_cached;
    pthread_mutex_unlock(&r->mu);
}

static void on_output(void *ud, const struct sched_output *o)
{
    struct engine *e = ud;
    struct request *r = o->user;
    if (o->admitted) {
        on_admitted(e, r, o->n_cached);
        return;
    }
    if (o->finished) r->in_sched = false;
    touch(e, r);
    if (r->done) return; /* the abort event after a stop string or an error */
    if (o->finish == FINISH_ERROR) { /* this request's row could not be sampled */
        char msg[300];
        snprintf(msg, sizeof msg, "sampling failed: %s", o->error ? o->error : "no token");
        pthread_mutex_lock(&r->mu);
        r->pend.request_error = o->request_error;
        pthread_mutex_unlock(&r->mu);
        finish(e, r, REQ_FINISH_ERROR, -1, msg);
        return;
    }
    if (o->prompt) {
        pthread_mutex_lock(&r->mu);
        bool ok = pend_append_prompt(r, o->logprob);
        pthread_mutex_unlock(&r->mu);
        r->news = true;
        if (!ok) {
            finish(e, r, REQ_FINISH_ERROR, -1, "out of memory for the request's output");
            sched_abort(e->s, r->seq_id, NULL, 0); /* its blocks are freed at the next step */
            r->sched_aborted = true;
        }
        return;
    }
    if (o->token >= 0) {
        double t = now_s();
        if (!r->had_token) {
            stats_observe(&e->stats, HIST_TTFT, t - r->t_submit);
            stats_add_tokens(&e->stats, (uint64_t)r->n_prompt, 1);
            stats_add_cached_prompt_tokens(&e->stats, (uint64_t)r->n_cached);
        } else {
            stats_observe(&e->stats, HIST_ITL, t - r->t_last_token);
            stats_add_tokens(&e->stats, 0, 1);
        }
        r->t_last_token = t;
        /* the end-of-generation token itself is reported as an id but never as text */
        bool eog = o->finished && o->finish == FINISH_STOP;
        size_t n_out = 0;
        int hit = STOP_CONTINUE;
        r->n_gen++;
        if (!eog) {
            int len = tok_stream_feed(e->m->tok, &r->ts, o->token, r->skip_special, e->piece,
                                      e->piece_cap);
            if (len > 0) hit = stop_pass(e, r, e->piece, (size_t)len, &n_out);
        }
        pthread_mutex_lock(&r->mu);
        if (!r->had_token) r->pend.t_first_token = t - r->t_submit;
        bool ok = pend_append(r, o->token, o->logprob, e->stop_out, n_out);
        pthread_mutex_unlock(&r->mu);
        r->had_token = true;
        r->news = true;
        if (!ok) hit = -1;
        if (hit != STOP_CONTINUE) {
            if (hit == STOP_HIT) finish(e, r, REQ_FINISH_STOP, stop_matched(&r->stop), NULL);
            else finish(e, r, REQ_FINISH_ERROR, -1, "out of memory for the request's output");
            if (!o->finished) { /* its blocks are freed at the next step */
                sched_abort(e->s, r->seq_id, NULL, 0);
                r->sched_aborted = true;
            }
            return;
        }
    }
    if (!o->finished) return;
    /* end of generation: release a trailing partial character and held stop-prefix bytes */
    enum req_finish f = o->finish == FINISH_STOP     ? REQ_FINISH_STOP
                        : o->finish == FINISH_LENGTH ? REQ_FINISH_LENGTH
                                                     : REQ_FINISH_ABORT;
    int stop_index = -1;
    if (f != REQ_FINISH_ABORT) {
        char tail[16];
        size_t n_out = 0, n_held = 0;
        int len = tok_stream_flush(&r->ts, tail, sizeof tail);
        if (len > 0 && stop_pass(e, r, tail, (size_t)len, &n_out) == STOP_HIT) {
            f = REQ_FINISH_STOP;
            stop_index = stop_matched(&r->stop);
        } else {
            /* held bytes go after what stop_pass emitted */
            stop_flush(&r->stop, e->stop_out + n_out, (size_t)e->piece_cap + STOP_MAX_LEN - n_out,
                       &n_held);
        }
        pthread_mutex_lock(&r->mu);
        bool ok = pend_append(r, -1, NULL, e->stop_out, n_out + n_held);
        pthread_mutex_unlock(&r->mu);
        if (!ok) {
            finish(e, r, REQ_FINISH_ERROR, -1, "out of memory for the request's output");
            return;
        }
    }
    finish(e, r, f, stop_index, NULL);
}

/* ---- scheduler thread: the loop ------------------------------------------------------- */

/* Moves the taken inbox list into the scheduler (FIFO); with refuse, only onto the live
 * list (shutdown or failure: finish_all follows). */
static void admit_inbox(struct engine *e, struct request *list, bool refuse)
{
    char err[ERR_BUF];
    while (list) {
        struct request *r = list;
        list = r->inbox_next;
        r->inbox_next = NULL;
        live_insert(e, r);
        if (refuse) continue;
        if (atomic_load(&r->abort_flag)) { /* never reaches the scheduler */
            finish(e, r, REQ_FINISH_ABORT, -1, NULL);
            continue;
        }
        int rc = sched_add(e->s, r->prompt, r->n_prompt, &r->sp, &r->seq_id, err, sizeof err);
        if (rc) {
            finish(e, r, REQ_FINISH_ERROR, -1, err);
            continue;
        }
        r->in_sched = true;
    }
}

static void scan_aborts(struct engine *e)
{
    if (!atomic_exchange(&e->abort_pending, false)) return;
    for (struct request *r = e->live; r; r = r->next)
        if (r->in_sched && !r->sched_aborted && !r->done && atomic_load(&r->abort_flag)) {
            sched_abort(e->s, r->seq_id, NULL, 0);
            r->sched_aborted = true;
        }
}

static void update_stats(struct engine *e)
{
    struct sched_stats st;
    sched_get_stats(e->s, &st);
    pthread_mutex_lock(&e->mu);
    int inbox = e->n_inbox;
    pthread_mutex_unlock(&e->mu);
    stats_set_gauges(&e->stats, st.num_running, st.num_waiting + inbox, st.bm.num_used,
                     st.bm.num_blocks);
    for (; e->seen_preemptions < st.preemptions; e->seen_preemptions++)
        stats_add_preemption(&e->stats);
    if (st.bm.query_tokens != e->seen_queries || st.bm.hit_tokens != e->seen_hits) {
        stats_add_prefix_cache(&e->stats, st.bm.query_tokens - e->seen_queries,
                               st.bm.hit_tokens - e->seen_hits);
        e->seen_queries = st.bm.query_tokens;
        e->seen_hits = st.bm.hit_tokens;
    }
    if (st.spec_drafts != e->seen_drafts) {
        stats_add_spec(&e->stats, st.spec_drafts - e->seen_drafts, st.spec_draft_tokens - e->seen_draft_tokens,
                       st.spec_accepted_tokens - e->seen_accepted);
        e->seen_drafts = st.spec_drafts;
        e->seen_draft_tokens = st.spec_draft_tokens;
        e->seen_accepted = st.spec_accepted_tokens;
    }
}

/* The liveness hook (engine_config.tick): called from this loop, never from a stuck step. */
static void engine_tick(struct engine *e)
{
    e->last_tick = now_s();
    e->cfg.tick(e->cfg.tick_ud);
}

static void *engine_thread(void *arg)
{
    struct engine *e = arg;
    char err[ERR_BUF];
    for (;;) {
        pthread_mutex_lock(&e->mu);
        for (;;) {
            if (e->stopping || e->inbox_head || e->abort_all || atomic_load(&e->abort_pending) ||
                (!e->failed && sched_has_work(e->s)))
                break;
            if (e->check_req) { /* idle: nothing in flight, the books must balance */
                int n_live = 0;
                for (struct request *r = e->live; r; r = r->next) n_live++;
                if (e->failed)
                    e->check_rc = err_set(e->check_err, sizeof e->check_err, ERR_UNAVAILABLE,
                                          "engine failed");
                else if (n_live)
                    e->check_rc = err_set(e->check_err, sizeof e->check_err, ERR_FORMAT,
                                          "%d requests still held by the idle engine", n_live);
                else
                    e->check_rc = bm_check(sched_block_manager(e->s), e->check_err,
                                           sizeof e->check_err);
                sched_get_stats(e->s, &e->check_st);
                e->check_req = false;
                pthread_cond_broadcast(&e->check_cv);
                continue;
            }
            if (!e->cfg.tick) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            /* idle with a tick: wake up in time for it */
            double wait = e->last_tick + e->cfg.tick_interval_s - now_s();
            if (wait <= 0) {
                pthread_mutex_unlock(&e->mu);
                engine_tick(e);
                pthread_mutex_lock(&e->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double frac = (double)ts.tv_nsec * 1e-9 + wait;
            ts.tv_sec += (time_t)frac;
            ts.tv_nsec = (long)((frac - (double)(time_t)frac) * 1e9);
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        struct request *list = e->inbox_head;
        e->inbox_head = e->inbox_tail = NULL;
        e->n_inbox = 0;
        bool stopping = e->stopping, failed = e->failed, abort_all = e->abort_all;
        e->abort_all = false;
        pthread_mutex_unlock(&e->mu);

        admit_inbox(e, list, stopping || failed);
        if (abort_all) {
            for (struct request *r = e->live; r; r = r->next) atomic_store(&r->abort_flag, true);
            atomic_store(&e->abort_pending, true);
        }
        if (stopping) {
            finish_all(e, REQ_FINISH_ABORT, NULL);
            break;
        }
        if (failed) { /* refuse what slipped in before the failure was seen */
            finish_all(e, REQ_FINISH_ERROR, e->fail_msg);
            continue;
        }
        scan_aborts(e);
        if (sched_has_work(e->s)) {
            int rc = sched_step(e->s, on_output, e, err, sizeof err);
            if (rc) {
                LOG_ERR("engine", "step failed, failing every request: %s", err);
                snprintf(e->fail_msg, sizeof e->fail_msg, "engine failure: %s", err);
                pthread_mutex_lock(&e->mu);
                e->failed = true;
                atomic_store(&e->failed_flag, true);
                pthread_mutex_unlock(&e->mu);
                if (e->cfg.on_failure) e->cfg.on_failure(e->cfg.failure_ud, e->fail_msg);
                finish_all(e, REQ_FINISH_ERROR, e->fail_msg);
            }
        }
        update_stats(e);
        notify_touched(e);
        if (e->cfg.tick && now_s() - e->last_tick >= e->cfg.tick_interval_s) engine_tick(e);
    }
    pthread_mutex_lock(&e->mu);
    e->thread_done = true;
    pthread_cond_broadcast(&e->check_cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- engine lifecycle and submit ------------------------------------------------------- */

int engine_create(struct engine **out, const struct model *m, const struct engine_config *cfg,
                  char *err, size_t errlen)
{
    *out = NULL;
    if (!m->tok)
        return err_set(err, errlen, ERR_INVALID, "engine: the model has no tokenizer");
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, errlen, ERR_NOMEM, "engine: out of memory");
    e->m = m;
    e->cfg = *cfg;
    e->next_id = 1;
    e->last_tick = now_s();
    if (e->cfg.tick && !(e->cfg.tick_interval_s > 0)) e->cfg.tick_interval_s = 1.0;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_cond_init(&e->check_cv, NULL);
    stats_init(&e->stats);
    atomic_init(&e->abort_pending, false);
    atomic_init(&e->failed_flag, false);
    int rc = sched_create(&e->s, m, &cfg->sched, err, errlen);
    if (rc) goto fail;
    e->cfg.sched = *sched_get_config(e->s);
    if ((rc = sched_warmup(e->s, err, errlen))) goto fail;
    /* one token's text, widened by U+FFFD for invalid bytes (tok_stream_feed's bound) */
    int longest = 0, n = tok_vocab_size(m->tok);
    for (int id = 0; id < n; id++) {
        int len = tok_token_bytes(m->tok, id, false, NULL, 0);
        if (len > longest) longest = len;
    }
    e->piece_cap = 3 * longest + 8;
    e->piece = malloc((size_t)e->piece_cap);
    e->stop_out = malloc((size_t)e->piece_cap + STOP_MAX_LEN);
    if (!e->piece || !e->stop_out) {
        rc = err_set(err, errlen, ERR_NOMEM, "engine: out of memory");
        goto fail;
    }
    struct bm_stats bs;
    bm_get_stats(sched_block_manager(e->s), &bs);
    stats_set_gauges(&e->stats, 0, 0, 0, bs.num_blocks);
    if (pthread_create(&e->thread, NULL, engine_thread, e)) {
        rc = err_set(err, errlen, ERR_NOMEM, "engine: cannot start the scheduler thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->draining = e->stopping = true;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    sched_free(e->s);
    free(e->piece);
    free(e->stop_out);
    stats_destroy(&e->stats);
    pthread_cond_destroy(&e->check_cv);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* Checks everything about a request that does not depend on the engine's state. */
static int validate(const struct engine *e, const int32_t *ids, int n, const struct req_params *p,
                    char *err, size_t errlen)
{
    int vocab = e->m->cfg.vocab_size, max_len = e->cfg.sched.max_model_len;
    if (!ids || n <= 0) return err_set(err, errlen, ERR_INVALID, "prompt: empty");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID,
                           "prompt: token id %d at position %d is outside the vocabulary [0, %d)",
                           ids[i], i, vocab);
    if (n >= max_len)
        return err_set(err, errlen, ERR_RANGE,
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%d tokens in the messages/prompt, which leaves no room for the completion. "
                       "Please reduce the length of the messages or prompt.", max_len, n);
    char why[ERR_BUF];
    if (sampler_params_validate(&p->sp, why, sizeof why))
        return err_set(err, errlen, ERR_INVALID, "%s", why);
    if (p->n_stops < 0 || p->n_stops > STOP_MAX_STRINGS)
        return err_set(err, errlen, ERR_INVALID, "stop: %d strings (at most %d)", p->n_stops,
                       STOP_MAX_STRINGS);
    if (stop_validate(p->stops, p->n_stops, why, sizeof why))
        return err_set(err, errlen, ERR_INVALID, "%s", why);
    if (p->logprobs < -1 || p->logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return err_set(err, errlen, ERR_INVALID, "logprobs: %d is outside [0, %d]", p->logprobs,
                       SAMPLER_MAX_TOP_LOGPROBS);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return err_set(err, errlen, ERR_INVALID, "prompt_logprobs: %d is outside [0, %d]", p->prompt_logprobs,
                       SAMPLER_MAX_TOP_LOGPROBS);
    if (p->n_bias < 0 || p->n_bias > SAMPLER_MAX_LOGIT_BIAS)
        return err_set(err, errlen, ERR_INVALID, "logit_bias: %d entries (at most %d)", p->n_bias,
                       SAMPLER_MAX_LOGIT_BIAS);
    if (p->n_bias && (!p->bias_ids || !p->bias))
        return err_set(err, errlen, ERR_INVALID, "logit_bias: missing arrays");
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID,
                           "logit_bias: token id %d is outside the vocabulary [0, %d)",
                           p->bias_ids[i], vocab);
        float b = p->bias[i];
        if (!(b == -INFINITY || (b >= -100.0f && b <= 100.0f))) /* NaN fails both */
            return err_set(err, errlen, ERR_INVALID,
                           "logit_bias: value %g for token %d is outside [-100, 100]", (double)b,
                           p->bias_ids[i]);
    }
    if (sched_check_end_params(p->stop_ids, p->n_stop_ids, p->min_tokens, vocab, err, errlen)) return ERR_INVALID;
    if (sched_check_bad_words(p->bad_words, p->bad_words_len, vocab, err, errlen)) return ERR_INVALID;
    if (p->n_allowed < 0 || (p->n_allowed && !p->allowed_ids))
        return err_set(err, errlen, ERR_INVALID, "allowed_token_ids: %d ids", p->n_allowed);
    for (int i = 0; i < p->n_allowed; i++)
        if (p->allowed_ids[i] < 0 || p->allowed_ids[i] >= vocab)
            return err_set(err, errlen, ERR_INVALID,
                           "allowed_token_ids: token id %d is outside the vocabulary [0, %d)", p->allowed_ids[i], vocab);
    if (p->cache_salt && !memchr(p->cache_salt, 0, BM_SALT_MAX + 1))
        return err_set(err, errlen, ERR_INVALID, "cache_salt: longer than %d bytes", BM_SALT_MAX);
    return 0;
}

int engine_submit(struct engine *e, const int32_t *ids, int n, const struct req_params *p,
                  req_notify_fn notify, void *ud, struct request **out, char *err,
                  size_t errlen)
{
    *out = NULL;
    int rc = validate(e, ids, n, p, err, errlen);
    if (rc) return rc;
    struct request *r = calloc(1, sizeof *r);
    if (!r) return err_set(err, errlen, ERR_NOMEM, "out of memory");
    r->prompt = malloc(sizeof *ids * (size_t)n);
    if (p->n_bias) {
        r->bias_ids = malloc(sizeof *r->bias_ids * (size_t)p->n_bias);
        r->bias = malloc(sizeof *r->bias * (size_t)p->n_bias);
    }
    if (p->n_allowed) r->allowed_ids = malloc(sizeof *r->allowed_ids * (size_t)p->n_allowed);
    if (p->bad_words_len) r->bad_words = malloc(sizeof *r->bad_words * (size_t)p->bad_words_len);
    if (!r->prompt || (p->n_bias && (!r->bias_ids || !r->bias)) || (p->n_allowed && !r->allowed_ids) ||
        (p->bad_words_len && !r->bad_words)) {
        free(r->prompt);
        free(r->bias_ids);
        free(r->bias);
        free(r->allowed_ids);
        free(r->bad_words);
        free(r);
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    }
    memcpy(r->prompt, ids, sizeof *ids * (size_t)n);
    r->n_prompt = n;
    r->e = e;
    sched_seq_params_default(&r->sp);
    r->sp.sp = p->sp;
    r->sp.max_tokens = p->max_tokens;
    r->sp.ignore_eos = p->ignore_eos;
    memcpy(r->sp.stop_ids, p->stop_ids, sizeof p->stop_ids[0] * (size_t)p->n_stop_ids);
    r->sp.n_stop_ids = p->n_stop_ids;
    r->sp.min_tokens = p->min_tokens;
    r->include_stop = p->include_stop_str;
    r->sp.logprobs = p->logprobs;
    r->sp.prompt_logprobs = p->prompt_logprobs;
    if (p->n_bias) {
        memcpy(r->bias_ids, p->bias_ids, sizeof *r->bias_ids * (size_t)p->n_bias);
        memcpy(r->bias, p->bias, sizeof *r->bias * (size_t)p->n_bias);
    }
    r->sp.bias_ids = r->bias_ids;
    r->sp.bias = r->bias;
    r->sp.n_bias = p->n_bias;
    if (p->n_allowed) memcpy(r->allowed_ids, p->allowed_ids, sizeof *r->allowed_ids * (size_t)p->n_allowed);
    r->sp.allowed_ids = r->allowed_ids;
    r->sp.n_allowed = p->n_allowed;
    if (p->bad_words_len) memcpy(r->bad_words, p->bad_words, sizeof *r->bad_words * (size_t)p->bad_words_len);
    r->sp.bad_words = r->bad_words;
    r->sp.bad_words_len = p->bad_words_len;
    if (p->cache_salt && p->cache_salt[0]) {
        r->sp.salt_len = strlen(p->cache_salt);
        memcpy(r->salt, p->cache_salt, r->sp.salt_len);
        r->sp.salt = r->salt;
    }
    r->sp.user = r;
    r->sp.grammar = grammar_ref(p->grammar); /* dropped by request_destroy */
    r->sp.grammar_deferred = p->grammar && p->grammar_deferred;
    r->sp.grammar_start_token = p->grammar_start_token;
    r->sp.priority = p->priority;
    r->skip_special = p->skip_special_tokens;
    stop_init(&r->stop, p->stops, p->n_stops); /* validated above */
    tok_stream_init(&r->ts);
    r->notify = notify;
    r->ud = ud;
    atomic_init(&r->refs, 2); /* the caller's and the engine's */
    atomic_init(&r->abort_flag, false);
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->pend.stop_index = -1;
    r->pend.n_prompt = n;
    r->pend.t_first_token = -1;
    r->pend.t_total = -1;
    r->t_submit = now_s();

    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stopping || e->failed) {
        rc = err_set(err, errlen, ERR_UNAVAILABLE, e->failed ? "the engine failed; restart the server"
                                                             : "the server is shutting down");
    } else if (!p->sibling && e->cfg.max_queued_requests > 0 &&
               e->n_queued >= e->cfg.max_queued_requests) {
        rc = err_set(err, errlen, ERR_BUSY, "too many queued requests (%d); retry later",
                     e->n_queued);
    } else if (!p->sibling && e->cfg.max_queued_tokens > 0 && e->n_queued > 0 &&
               e->queued_tokens + n > e->cfg.max_queued_tokens) {
        rc = err_set(err, errlen, ERR_BUSY, "too many queued prompt tokens (%lld); retry later",
                     (long long)e->queued_tokens);
    } else {
        r->id = e->next_id++;
        if (p->sibling) { /* the request was counted with its first choice */
            r->dequeued = true;
        } else {
            e->n_queued++;
            e->queued_tokens += n;
        }
        e->n_active++;
        /* *out is written before the scheduler thread can see r, so notify may read it */
        *out = r;
        if (e->inbox_tail) e->inbox_tail->inbox_next = r;
        else e->inbox_head = r;
        e->inbox_tail = r;
        e->n_inbox++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (rc) {
        request_destroy(r);
        return rc;
    }
    LOG_DEBUG("engine", "req %lld submitted: %d prompt tokens", (long long)r->id, n);
    return 0;
}

void engine_abort_all(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->abort_all = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_drain(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_mutex_unlock(&e->mu);
}

int engine_num_active(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    int n = e->n_active;
    pthread_mutex_unlock(&e->mu);
    return n;
}

const struct sched_config *engine_sched_config(const struct engine *e) { return &e->cfg.sched; }

const struct backend_info *engine_backend_info(const struct engine *e) { return sched_backend_info(e->s); }

bool engine_failed(struct engine *e) { return atomic_load(&e->failed_flag); }

void engine_get_stats(struct engine *e, struct engine_stats *out)
{
    stats_snapshot(&e->stats, out);
}

int engine_debug_check(struct engine *e, struct sched_stats *st, char *err, size_t errlen)
{
    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->thread_done) {
        pthread_mutex_unlock(&e->mu);
        return err_set(err, errlen, ERR_UNAVAILABLE, "the engine is shutting down");
    }
    e->check_req = true;
    pthread_cond_signal(&e->cv);
    while (e->check_req && !e->thread_done) pthread_cond_wait(&e->check_cv, &e->mu);
    int rc = e->check_req ? ERR_UNAVAILABLE : e->check_rc;
    if (rc) err_set(err, errlen, rc, "%s", e->check_req ? "the engine stopped" : e->check_err);
    if (st) *st = e->check_st;
    pthread_mutex_unlock(&e->mu);
    return rc;
}
