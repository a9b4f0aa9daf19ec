/* threadpool.c — see threadpool.h.
 *
 * Shares, not threads: a run is nth shares (ith = 0 .. nth-1). The owner and every
 * awake worker claim shares from an atomic counter until none is left, so a worker that
 * is descheduled (more threads than free cores — a busy laptop, a shared CI box) never
 * holds up a run: the owner simply runs its share too. The owner then waits only for
 * shares already claimed. fn may therefore see any ith on any thread, which is all the
 * contract promises (per-ith scratch stays private to one share).
 *
 * Waiting, for workers between runs and for the owner at the end of a run: spin briefly
 * (a decode matmul lasts tens of microseconds), yield the core a few times, then sleep
 * on a condition variable.
 */
#define _GNU_SOURCE
#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define SPIN_ITERS 2000
#define YIELD_ITERS 64

struct threadpool {
    int n_threads;
    pthread_t *threads; /* [n_threads - 1] workers */
    tp_fn fn;           /* the current run, published before next_share is reset */
    void *arg;
    atomic_int next_share; /* next unclaimed share of the current run (may pass n_threads) */
    atomic_int done_shares;
    atomic_uint generation; /* bumped once per run */
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers: new generation or stop */
    pthread_cond_t done; /* owner: every share finished */
};

/* Claims and runs shares until none is left. Returns 1 if this call finished the last
 * share of the run. */
static int run_shares(struct threadpool *tp)
{
    int last = 0;
    for (;;) {
        int s = atomic_fetch_add_explicit(&tp->next_share, 1, memory_order_acq_rel);
        if (s >= tp->n_threads) return last;
        tp->fn(tp->arg, s, tp->n_threads);
        last = atomic_fetch_add_explicit(&tp->done_shares, 1, memory_order_acq_rel) + 1 == tp->n_threads;
    }
}

static void *worker_main(void *p)
{
    struct threadpool *tp = p;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
            if (spins < SPIN_ITERS + YIELD_ITERS) { sched_yield(); continue; }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = gen;
        if (run_shares(tp)) {
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
    atomic_store(&tp->next_share, n_threads); /* nothing to claim yet */
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads - 1, sizeof *tp->threads);
        if (!tp->threads) {
            free(tp);
            return NULL;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            if (pthread_create(&tp->threads[i], NULL, worker_main, tp) != 0) {
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
    for (int i = 0; i < tp->n_threads - 1; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp->threads);
    free(tp);
}

int tp_size(const struct threadpool *tp) { return tp->n_threads; }

void tp_run(struct threadpool *tp, tp_fn fn, void *arg)
{
    if (tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->done_shares, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->next_share, 0, memory_order_release);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    run_shares(tp);
    int spins = 0;
    while (atomic_load_explicit(&tp->done_shares, memory_order_acquire) < tp->n_threads) {
        if (++spins < SPIN_ITERS) { CPU_RELAX(); continue; }
        if (spins < SPIN_ITERS + YIELD_ITERS) { sched_yield(); continue; }
        pthread_mutex_lock(&tp->mu);
        while (atomic_load(&tp->done_shares) < tp->n_threads) pthread_cond_wait(&tp->done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
}

void tp_split(long n, int ith, int nth, long *begin, long *end)
{
    long per = n / nth, rem = n % nth;
    *begin = ith * per + (ith < rem ? ith : rem);
    *end = *begin + per + (ith < rem ? 1 : 0);
}
