/* profile.cu — tessera_cuda_profile_forward (contract in profile.h): a forward's GPU time
 * kernel by kernel, from events cu_forward records after each of its kernels while
 * b->prof_ev is set.
 */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/profile.h"

extern "C" {
#include "util/err.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOLD_US 20000u /* how long the stream is held while a forward is enqueued */

/* A host function on the stream: nothing after it starts until it returns. */
static void hold_stream(void *arg) { usleep(*(const unsigned *)arg); }

static int find_or_add(struct tessera_cuda_profile_row *rows, int *n, int max_rows, const char *name)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(rows[i].name, name)) return i;
    if (*n >= max_rows) return -1;
    snprintf(rows[*n].name, sizeof rows[*n].name, "%s", name);
    rows[*n].calls = 0;
    rows[*n].ms = 0;
    return (*n)++;
}

/* One held, event-timed forward: adds each kernel's time to rows and the whole to *total. */
static int profile_once(struct cuda_backend *b, cudaEvent_t ev0, struct tessera_cuda_profile_row *rows, int *n,
                        int max_rows, double *total, char *err, size_t errlen)
{
    static const unsigned hold_us = HOLD_US;
    int e;
    if ((e = cudaLaunchHostFunc(b->stream, hold_stream, (void *)&hold_us)) || (e = cudaEventRecord(ev0, b->stream)))
        return cu_error(b, false, e, err, errlen, "profile: holding the stream");
    const char *where = "";
    int layer = -1;
    b->prof_n = 0;
    e = cu_forward(b, &b->last_shape, &where, &layer);
    const int marks = b->prof_n;
    if (e) return cu_error(b, true, e, err, errlen, "profile: kernel %s, layer %d", where, layer);
    if (!marks) return err_set(err, errlen, ERR_INVALID, "cuda: profile: the forward recorded no kernel");
    if ((e = cudaEventSynchronize(b->prof_ev[marks - 1])))
        return cu_error(b, true, e, err, errlen, "profile: the forward failed on the device");
    cudaEvent_t prev = ev0;
    for (int i = 0; i < marks; i++) {
        float ms = 0;
        if ((e = cudaEventElapsedTime(&ms, prev, b->prof_ev[i])))
            return cu_error(b, false, e, err, errlen, "profile: cudaEventElapsedTime");
        const int r = find_or_add(rows, n, max_rows, b->prof_name[i]);
        if (r >= 0) {
            rows[r].calls++;
            rows[r].ms += ms;
        }
        prev = b->prof_ev[i];
    }
    float all = 0;
    if ((e = cudaEventElapsedTime(&all, ev0, b->prof_ev[marks - 1])))
        return cu_error(b, false, e, err, errlen, "profile: cudaEventElapsedTime");
    *total += all;
    return 0;
}

extern "C" int tessera_cuda_profile_forward(void *impl, int reps, struct tessera_cuda_profile_row *rows, int max_rows,
                                            double *forward_ms, char *err, size_t errlen)
{
    struct cu_group *g = (struct cu_group *)impl;
    struct cuda_backend *b = g->ranks[0];
    if (g->world > 1)
        return err_set(err, errlen, ERR_UNSUPPORTED, "cuda: the forward profile runs on one GPU (tensor parallel: %d)",
                       g->world);
    if (b->broken) return err_set(err, errlen, ERR_IO, "cuda: backend unusable: %s", b->broken_msg);
    if (b->in_flight) return err_set(err, errlen, ERR_BUSY, "cuda: a step is in flight");
    if (!b->has_last_shape) return err_set(err, errlen, ERR_INVALID, "cuda: profile: no step has run yet");
    if (reps < 1 || !rows || max_rows < 1 || !forward_ms)
        return err_set(err, errlen, ERR_INVALID, "cuda: profile: reps %d, %d rows", reps, max_rows);

    const int cap = 16 * b->m->cfg.n_layers + 64; /* > the forward's kernels (11 per layer at most) */
    cudaEvent_t ev0 = NULL;
    b->prof_ev = (cudaEvent_t *)calloc((size_t)cap, sizeof *b->prof_ev);
    b->prof_name = (const char **)calloc((size_t)cap, sizeof *b->prof_name);
    int rc = 0, made = 0, n = 0, e;
    double total = 0;
    if (!b->prof_ev || !b->prof_name) rc = err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    if (!rc && (e = cudaEventCreate(&ev0))) rc = cu_error(b, false, e, err, errlen, "profile: creating events");
    while (!rc && made < cap)
        if ((e = cudaEventCreate(&b->prof_ev[made]))) rc = cu_error(b, false, e, err, errlen, "profile: creating events");
        else made++;
    b->prof_cap = cap;
    for (int r = 0; r < reps && !rc; r++) rc = profile_once(b, ev0, rows, &n, max_rows, &total, err, errlen);
    for (int i = 0; i < made; i++) cudaEventDestroy(b->prof_ev[i]);
    if (ev0) cudaEventDestroy(ev0);
    free(b->prof_ev);
    free(b->prof_name);
    b->prof_ev = NULL;
    b->prof_name = NULL;
    b->prof_n = b->prof_cap = 0;
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        rows[i].ms /= reps;
        rows[i].calls /= reps;
    }
    *forward_ms = total / reps;
    return n;
}
