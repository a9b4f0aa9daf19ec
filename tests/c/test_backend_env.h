/* test_backend_env.h — what the engine-level C tests take from the environment: the
 * backend device (TESSERA_TEST_DEVICE=auto|cpu|cuda, default cpu; cuda needs
 * TESSERA_CUDA_LIB, e.g. build/libtessera-cuda-emu.so) and the model
 * (TESSERA_TEST_MODEL, a path relative to the repository root, default the caller's), and
 * the GPUs the model is split over (TESSERA_TEST_TP, default 1; the emulator needs
 * TESSERA_EMU_DEVICES at least as large). Include after test.h. */
#ifndef TESSERA_TEST_BACKEND_ENV_H
#define TESSERA_TEST_BACKEND_ENV_H

#include "backend/backend.h"
#include "model/model.h"
#include "test.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sets *device and loads *model (load flags as model_load); on an error prints why and the
 * failed summary line and returns false (main then returns 1). */
static inline bool test_backend_env(enum backend_device *device, const char *default_model, unsigned flags,
                                    struct model **model)
{
    char err[ERR_BUF];
    const char *dev = getenv("TESSERA_TEST_DEVICE");
    if (dev && backend_device_parse(dev, device)) {
        fprintf(stderr, "TESSERA_TEST_DEVICE=%s: not auto, cpu or cuda\n", dev);
        printf("0 passed, 1 failed\n");
        return false;
    }
    const char *rel = getenv("TESSERA_TEST_MODEL") ? getenv("TESSERA_TEST_MODEL") : default_model;
    if (model_load(test_path(rel), flags, model, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", rel, err);
        printf("0 passed, 1 failed\n");
        return false;
    }
    return true;
}

/* TESSERA_TEST_TP: the backend's tensor_parallel_size (1 when unset). */
static inline int test_backend_tp(void)
{
    const char *v = getenv("TESSERA_TEST_TP");
    return v && atoi(v) > 0 ? atoi(v) : 1;
}

/* Whether device runs on a real GPU: cuda with a TESSERA_CUDA_LIB that is not the
 * emulator's (libtessera-cuda-emu.so). Tests keep the emulator's exact bounds and loosen
 * only where a real GPU's arithmetic (its expf, FMA contraction, cuBLAS's kernels) moves
 * the last bits. */
static inline bool test_backend_real_gpu(enum backend_device device)
{
    const char *lib = getenv("TESSERA_CUDA_LIB");
    return device == BACKEND_DEVICE_CUDA && !(lib && strstr(lib, "-emu"));
}

#endif
