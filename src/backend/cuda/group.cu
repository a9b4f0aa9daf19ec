/* group.cu — tensor parallelism: the ranks of a struct cu_group driven together.
 *
 * Every call the engine makes (submit, wait, logits) and every start-up phase is a rank
 * function run on all ranks at once by cu_group_run. With one GPU it runs inline on the
 * caller's thread. With more, each rank has a worker thread that owns the rank's device
 * (cudaSetDevice once) and issues all of its CUDA and NCCL calls, so the ranks' collectives
 * meet without NCCL group calls and no rank's host work waits for another's.
 *
 * Protocol (one mutex and condition variable per group): the caller stores the job and
 * bumps `gen`; each worker runs it once per generation and counts itself `done`; the
 * caller waits until all are. A failing rank makes the caller abort the communicators (at
 * once, or when the call returns): a rank that failed will never join the collectives its
 * peers are waiting in or have queued, and every failure here is fatal to the backend
 * anyway (errors that are the caller's — a bad batch — are found before any rank runs).
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long the caller waits for the other ranks after one failed and the communicators
 * were aborted; past it the call returns the failure and the stuck workers are left. */
#define ABORT_GRACE_S 30

struct cu_workers {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long gen;             /* job generation; a worker runs each one once */
    int done;             /* workers finished with the current generation */
    bool quit;
    cu_rank_fn fn;
    void *arg;
    int rc[CU_MAX_RANKS];
    char err[CU_MAX_RANKS][ERR_BUF];
    pthread_t th[CU_MAX_RANKS];
    int started;          /* threads running */
    bool stuck;           /* a worker did not finish after an abort: never joined */
    struct cu_group *g;
};

struct worker_start {
    struct cu_workers *w;
    int rank;
};

static void *worker_main(void *p)
{
    struct worker_start *ws = (struct worker_start *)p;
    struct cu_workers *w = ws->w;
    const int r = ws->rank;
    free(ws);
    struct cuda_backend *b = w->g->ranks[r];
    cudaSetDevice(b->device);
    long seen = 0;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->quit && w->gen == seen) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        seen = w->gen;
        cu_rank_fn fn = w->fn;
        void *arg = w->arg;
        pthread_mutex_unlock(&w->mu);
        char err[ERR_BUF] = "";
        int rc = fn(b, arg, err, sizeof err);
        pthread_mutex_lock(&w->mu);
        w->rc[r] = rc;
        memcpy(w->err[r], err, sizeof err);
        w->done++;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void abort_comms(struct cu_group *g)
{
    if (g->aborted) return;
    g->aborted = true;
    for (int r = 0; r < g->world; r++)
        if (g->comms[r]) g->nccl.comm_abort(g->comms[r]);
    LOG_ERR("cuda", "a GPU failed: the NCCL communicators were aborted");
}

int cu_group_run(struct cu_group *g, cu_rank_fn fn, void *arg, char *err, size_t errlen)
{
    if (g->world == 1) {
        struct cuda_backend *b = g->ranks[0];
        cudaError_t e = cudaSetDevice(b->device);
        if (e != cudaSuccess) return cu_error(b, false, e, err, errlen, "selecting device %d", b->device);
        return fn(b, arg, err, errlen);
    }
    struct cu_workers *w = g->workers;
    pthread_mutex_lock(&w->mu);
    w->fn = fn;
    w->arg = arg;
    w->done = 0;
    for (int r = 0; r < g->world; r++) w->rc[r] = 0;
    w->gen++;
    pthread_cond_broadcast(&w->cv);
    bool failed = false;
    struct timespec deadline;
    while (w->done < g->world) {
        for (int r = 0; r < g->world && !failed; r++)
            if ((failed = w->rc[r] != 0)) {
                clock_gettime(CLOCK_REALTIME, &deadline);
                deadline.tv_sec += ABORT_GRACE_S;
            }
        if (!failed) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        if (!g->aborted) {
            pthread_mutex_unlock(&w->mu);
            abort_comms(g);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (pthread_cond_timedwait(&w->cv, &w->mu, &deadline) == ETIMEDOUT && w->done < g->world) {
            w->stuck = true;
            LOG_ERR("cuda", "%d of %d GPUs did not finish %d s after the communicators were aborted",
                    g->world - w->done, g->world, ABORT_GRACE_S);
            break;
        }
    }
    int rc = 0;
    for (int r = 0; r < g->world && !rc; r++)
        if ((rc = w->rc[r])) err_set(err, errlen, rc, "GPU %d (device %d): %s", r, g->ranks[r]->device, w->err[r]);
    pthread_mutex_unlock(&w->mu);
    /* also when every rank returned: a rank that failed while enqueueing a step left its
       peers' collectives of that step queued with no partner */
    if (rc) abort_comms(g);
    return rc;
}

int cu_group_start(struct cu_group *g, char *err, size_t errlen)
{
    if (g->world == 1) return 0;
    int rc = cu_nccl_open(&g->nccl, err, errlen);
    if (rc) return rc;
    int devs[CU_MAX_RANKS], version = 0;
    for (int r = 0; r < g->world; r++) devs[r] = g->ranks[r]->device;
    int nr = g->nccl.comm_init_all(g->comms, g->world, devs);
    if (nr) {
        memset(g->comms, 0, sizeof g->comms);
        return err_set(err, errlen, ERR_IO, "cuda: NCCL could not connect the %d GPUs: %s", g->world,
                       g->nccl.error_string(nr));
    }
    g->nccl.get_version(&version);
    for (int r = 0; r < g->world; r++) {
        g->ranks[r]->comm = g->comms[r];
        g->ranks[r]->nccl = &g->nccl;
    }
    struct cu_workers *w = (struct cu_workers *)calloc(1, sizeof *w);
    if (!w) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->g = g;
    g->workers = w;
    for (int r = 0; r < g->world; r++) {
        struct worker_start *ws = (struct worker_start *)malloc(sizeof *ws);
        if (!ws) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
        ws->w = w;
        ws->rank = r;
        if (pthread_create(&w->th[r], NULL, worker_main, ws)) {
            free(ws);
            return err_set(err, errlen, ERR_IO, "cuda: cannot start the worker thread of GPU %d", r);
        }
        w->started++;
    }
    LOG_INFO("cuda", "tensor parallel over %d GPUs (NCCL %d.%d.%d), one worker thread each", g->world,
             version / 10000, version / 100 % 100, version % 100);
    return 0;
}

void cu_group_stop(struct cu_group *g)
{
    struct cu_workers *w = g->workers;
    if (w) {
        pthread_mutex_lock(&w->mu);
        w->quit = true;
        pthread_cond_broadcast(&w->cv);
        const bool stuck = w->stuck;
        pthread_mutex_unlock(&w->mu);
        for (int r = 0; r < w->started; r++) {
            if (stuck) pthread_detach(w->th[r]);
            else pthread_join(w->th[r], NULL);
        }
        if (!stuck) { /* a stuck worker may still touch w */
            pthread_cond_destroy(&w->cv);
            pthread_mutex_destroy(&w->mu);
            free(w);
        }
        g->workers = NULL;
    }
    for (int r = 0; r < g->world; r++) { /* an aborted communicator is already freed */
        if (g->comms[r] && !g->aborted) g->nccl.comm_destroy(g->comms[r]);
        g->comms[r] = NULL;
    }
    if (g->nccl.comm_init_all) cu_nccl_close(&g->nccl);
}

int cu_all_reduce(struct cuda_backend *b, float *x, size_t n)
{
    if (b->world == 1) return 0;
    int r = b->nccl->all_reduce(x, x, n, CU_NCCL_FLOAT32, CU_NCCL_SUM, b->comm, b->stream);
    if (r) LOG_ERR("cuda", "GPU %d: ncclAllReduce: %s", b->rank, b->nccl->error_string(r));
    return r ? (int)cudaErrorUnknown : 0;
}
