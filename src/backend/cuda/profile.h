/* profile.h — tessera_cuda_profile_forward (src/backend/cuda/profile.cu): where the GPU
 * time of one forward goes, kernel by kernel. For benchmarks (tests/c/tool_bench_cuda.c
 * --profile, scripts/gpu-check.sh); callers resolve it with dlsym like the library's other
 * entry points. Plain C.
 */
#ifndef TESSERA_BACKEND_CUDA_PROFILE_H
#define TESSERA_BACKEND_CUDA_PROFILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One kernel name of the forward (src/backend/cuda/forward.cu's step names), summed over
 * the layers: launches per forward and GPU milliseconds per forward. */
struct tessera_cuda_profile_row {
    char name[48];
    int calls;
    double ms;
};

/* Runs the forward of the backend's last step again, reps times, over the inputs still in
 * its buffers (the same KV slots are written with the same values; the logits are
 * overwritten after the step's tokens were sampled), on the first GPU, eagerly: the stream
 * is held by a host function while the kernels and an event after each are enqueued, so
 * they then run back to back and each pair of events times one kernel plus an event's
 * overhead. Fills rows[0, return) in first-launch order with the averages per forward and
 * *forward_ms with the whole forward's. One GPU only; no step may be in flight. Returns the
 * row count, or a negative ERR_* code with the reason in err. */
int tessera_cuda_profile_forward(void *impl, int reps, struct tessera_cuda_profile_row *rows, int max_rows,
                                 double *forward_ms, char *err, size_t errlen);

typedef int (*tessera_cuda_profile_fn)(void *, int, struct tessera_cuda_profile_row *, int, double *, char *, size_t);

#ifdef __cplusplus
}
#endif

#endif
