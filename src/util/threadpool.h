/* threadpool.h — a fixed pool of worker threads for data-parallel ops.
 *
 * tp_run(tp, fn, arg) calls fn(arg, ith, nth) once for every ith in [0, nth) — on the
 * n-1 workers and on the calling thread (ith 0) — and returns when all have finished.
 * Work is split by the callee from ith/nth, so no allocation or queue happens per call.
 * One thread at a time may call tp_run on a pool (the owner: the model's forward).
 * Workers spin briefly then sleep on a condition variable between runs.
 */
#ifndef TESSERA_UTIL_THREADPOOL_H
#define TESSERA_UTIL_THREADPOOL_H

#ifdef __cplusplus
extern "C" {
#endif

struct threadpool;

typedef void (*tp_fn)(void *arg, int ith, int nth);

/* Creates a pool with n_threads total (including the caller). n_threads <= 0 means the
 * number of online CPUs. Returns NULL on failure. */
struct threadpool *tp_create(int n_threads);
void tp_free(struct threadpool *tp);
int tp_size(const struct threadpool *tp);
void tp_run(struct threadpool *tp, tp_fn fn, void *arg);

/* Splits [0, n) into nth nearly equal ranges; writes range ith to [*begin, *end). */
void tp_split(long n, int ith, int nth, long *begin, long *end);

#ifdef __cplusplus
}
#endif

#endif
