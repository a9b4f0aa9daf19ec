/* devices.c — `tessera devices`: which backends this binary can use here. Loads the CUDA
 * backend library if there is one (src/backend/cuda_lib.h) and lists its GPUs; on a
 * machine without one it says so and exits 0 — the CPU backend is always available. */
#include "backend/cuda_lib.h"
#include "cli/cli.h"
#include "util/err.h"

#include <stdio.h>
#include <string.h>

int cli_devices(int argc, char **argv)
{
    if (argc > 1) {
        int help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        fprintf(help ? stdout : stderr,
                "usage: tessera devices\n\nLists the backends this binary can use on this machine: the CPU always,\n"
                "NVIDIA GPUs when libtessera-cuda.so (beside the binary, or $TESSERA_CUDA_LIB) loads.\n");
        return help ? 0 : 2;
    }
    printf("cpu: available\n");
    struct cuda_lib lib;
    char err[ERR_BUF];
    if (cuda_lib_open(&lib, err, sizeof err)) {
        printf("cuda: not available (%s)\n", err);
        return 0;
    }
    int rt = 0, drv = 0;
    lib.versions(&rt, &drv);
    int n = lib.device_count(err, sizeof err);
    printf("cuda: library %s (runtime %d.%d, driver %d.%d)\n", lib.path, rt / 1000, rt % 1000 / 10, drv / 1000,
           drv % 1000 / 10);
    if (n <= 0) printf("cuda: no usable device (%s)\n", n < 0 ? err : "0 devices");
    for (int d = 0; d < n; d++) {
        struct cuda_device_info di;
        if (lib.device_info(d, &di, err, sizeof err)) {
            printf("cuda:%d: %s\n", d, err);
            continue;
        }
        printf("cuda:%d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free)\n", d, di.name, di.major,
               di.minor, di.sm_count, di.total_mem / 1073741824.0, di.free_mem / 1073741824.0);
    }
    if (n > 1) { /* what --tensor-parallel-size needs */
        int v = lib.nccl_version(err, sizeof err);
        if (v > 0) printf("nccl: %d.%d.%d (--tensor-parallel-size up to %d)\n", v / 10000, v / 100 % 100, v % 100, n);
        else printf("nccl: not available (%s): --tensor-parallel-size needs it\n", err);
    }
    cuda_lib_close(&lib);
    return 0;
}
