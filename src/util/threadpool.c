/* threadpool.c — see threadpool.h.
 *
 * Synchronisation: the owner publishes (fn, arg) and bumps `generation`; workers wait
 * for a new generation (spinning for a short while, since decode issues hundreds of
 * small runs per token, then sleeping on `wake`), run their share, and decrement
 * `pending`; the owner runs share 0 and spins/sleeps until `pending` is zero.
 */
#define _GNU_SOURCE
#include "util/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 20000

struct worker {
    struct threadpool *tp;
    int ith;
    pthread_t thread;
};

struct threadpool {
    int n_threads;
    struct worker *workers; /* [n_threads - 1] */
    tp_fn fn;
    void *arg;
    atomic_uint generation;
    atomic_int pending;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers: new generation or stop */
    pthread_cond_t done; /* owner: pending reached 0 */
};

static void *worker_main(void *p)
{
    struct worker *w = p;
    struct threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = gen;
        tp->fn(tp->arg, w->ith, tp->n_threads);
        if (atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

struct threadpool *tp_create(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    struct threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) { free(tp); return NULL; }
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]) != 0) {
                tp->n_threads = i + 1; /* keep the ones that started */
                break;
            }
        }
    }
    return tp;
}

void tp_free(struct threadpool *tp)
{
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_threads - 1; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp->workers);
    free(tp);
}

int tp_size(const struct threadpool *tp) { return tp->n_threads; }

void tp_run(struct threadpool *tp, tp_fn fn, void *arg)
{
    if (tp->n_threads == 1) { fn(arg, 0, 1); return; }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n_threads);
    int spins = 0;
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
        pthread_mutex_lock(&tp->mu);
        while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
}

void tp_split(long n, int ith, int nth, long *begin, long *end)
{
    long per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}
