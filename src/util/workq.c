/* workq.c — see workq.h. A ring of pending items under one mutex; idle threads wait on a
 * condition variable. Invariant (under mu): 0 <= n <= cap, items [head, head + n) mod cap
 * are queued in push order. */
#include "util/workq.h"

#include <pthread.h>
#include <stdlib.h>

struct item {
    workq_fn fn;
    void *arg;
};

struct workq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct item *ring;   /* [cap] */
    int cap, head, n;
    bool stopping;
    pthread_t *threads;  /* [n_threads] */
    int n_threads;
};

static void *workq_main(void *arg)
{
    struct workq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->n == 0 && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
        if (q->n == 0) break; /* stopping, and nothing left */
        struct item it = q->ring[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
        pthread_mutex_unlock(&q->mu);
        it.fn(it.arg);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

struct workq *workq_create(int n_threads, int max_pending)
{
    if (n_threads < 1 || max_pending < 1) return NULL;
    struct workq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    q->ring = calloc((size_t)max_pending, sizeof *q->ring);
    q->threads = calloc((size_t)n_threads, sizeof *q->threads);
    if (!q->ring || !q->threads) {
        free(q->ring);
        free(q->threads);
        free(q);
        return NULL;
    }
    q->cap = max_pending;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    for (; q->n_threads < n_threads; q->n_threads++)
        if (pthread_create(&q->threads[q->n_threads], NULL, workq_main, q)) break;
    if (q->n_threads == 0) {
        workq_free(q);
        return NULL;
    }
    return q;
}

bool workq_push(struct workq *q, workq_fn fn, void *arg)
{
    pthread_mutex_lock(&q->mu);
    bool ok = !q->stopping && q->n < q->cap;
    if (ok) {
        q->ring[(q->head + q->n) % q->cap] = (struct item){ fn, arg };
        q->n++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

int workq_pending(struct workq *q)
{
    pthread_mutex_lock(&q->mu);
    int n = q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void workq_free(struct workq *q)
{
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n_threads; i++) pthread_join(q->threads[i], NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->ring);
    free(q->threads);
    free(q);
}
