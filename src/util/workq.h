/* workq.h — a small FIFO work queue served by a fixed set of threads.
 *
 * For work that must not run on an event loop (parsing a request body, rendering a chat
 * template, tokenizing a prompt): workq_push hands fn(arg) to the next free thread. The
 * queue is bounded: past max_pending waiting items, workq_push refuses (the caller
 * answers "busy") instead of letting work pile up. Items run in push order, each exactly
 * once; workq_free runs what is still queued, then joins the threads.
 *
 * Threads: workq_push from any thread; workq_free from one thread, after the last push.
 */
#ifndef TESSERA_UTIL_WORKQ_H
#define TESSERA_UTIL_WORKQ_H

#include <stdbool.h>

struct workq;

typedef void (*workq_fn)(void *arg);

/* n_threads >= 1 threads named by nothing in particular; max_pending >= 1 items may wait.
 * Returns NULL on failure. */
struct workq *workq_create(int n_threads, int max_pending);
/* Queues fn(arg). Returns false (nothing queued) when max_pending items already wait or
 * the queue is being freed. */
bool workq_push(struct workq *q, workq_fn fn, void *arg);
/* Items queued and not yet started. */
int workq_pending(struct workq *q);
/* Runs the queued items, joins the threads, frees q. NULL is a no-op. */
void workq_free(struct workq *q);

#endif
