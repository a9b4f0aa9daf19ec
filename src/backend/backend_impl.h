/* backend_impl.h — what a backend implementation provides behind backend.h (private to
 * src/backend/: the engine includes backend.h only).
 *
 * backend.c owns struct backend and dispatches through a struct backend_ops. The CPU
 * implementation is linked into build/tessera (backend/cpu/backend_cpu.c); the CUDA one
 * lives in libtessera-cuda.so (src/backend/cuda/), loaded at run time by cuda_lib.c and
 * entered through the C symbol tessera_cuda_backend_create (cuda_lib.h). The library is
 * built from the same sources as the binary (ABI checked by TESSERA_CUDA_ABI), so the
 * structs passed across (struct model, struct batch, struct sampler, …) have one layout.
 * Under test the same entry point comes from libtessera-cuda-emu.so: the CUDA backend
 * compiled against the CUDA-on-CPU emulator (TESSERA_CUDA_LIB selects it).
 */
#ifndef TESSERA_BACKEND_BACKEND_IMPL_H
#define TESSERA_BACKEND_BACKEND_IMPL_H

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One implementation's entry points; impl is its private state. Contracts as backend.h's
 * functions of the same names; backend.c checks the in-flight rule before calling. */
struct backend_ops {
    int (*submit)(void *impl, const struct batch *batch, const struct backend_sample *samples, char *err,
                  size_t errlen);
    int (*wait)(void *impl, struct backend_token *out, char *err, size_t errlen);
    int (*logits)(void *impl, const struct batch *batch, const float **logits, char *err, size_t errlen);
    void (*destroy)(void *impl);
};

/* Creates an implementation: fills *ops, *impl and info (name, device, kv_dtype,
 * block_size, num_blocks, byte counts, max_concurrency, graphs). cfg is already validated
 * and defaulted by backend.c (block_size > 0, max_model_len > 0). */
typedef int (*backend_create_fn)(const struct model *m, const struct backend_config *cfg,
                                 const struct backend_ops **ops, void **impl, struct backend_info *info,
                                 char *err, size_t errlen);

/* The CPU implementation (backend/cpu/backend_cpu.c). */
int backend_cpu_create(const struct model *m, const struct backend_config *cfg, const struct backend_ops **ops,
                       void **impl, struct backend_info *info, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
