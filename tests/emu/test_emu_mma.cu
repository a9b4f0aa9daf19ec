/* test_emu_mma.cu — what the emulated ts_ldmatrix_x4 must refuse, as a GPU would fault
 * or hang on it: a misaligned row, a row outside shared memory, a missing lane. The
 * registers and products themselves are tested by tests/kernels/test_kernel_mma.cu, which
 * also runs on a GPU.
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

/* ---- what must abort ------------------------------------------------------------------------ */

__global__ void ldmatrix_misaligned_kernel(const uint16_t *)
{
    TS_SHARED(uint16_t, tab, [40][8]);
    uint32_t r[4];
    ts_ldmatrix_x4(r, &tab[threadIdx.x][0] + 4); /* planted bug: 8 bytes off */
}

__global__ void ldmatrix_global_kernel(const uint16_t *g)
{
    uint32_t r[4];
    ts_ldmatrix_x4(r, g + 8 * threadIdx.x); /* planted bug: a global-memory row */
}

__global__ void ldmatrix_partial_kernel(const uint16_t *)
{
    TS_SHARED(uint16_t, tab, [32][8]);
    uint32_t r[4];
    if (threadIdx.x != 5) ts_ldmatrix_x4(r, &tab[threadIdx.x][0]); /* planted bug: lane 5 skips it */
}

static emu_child run_bad(void (*kernel)(const uint16_t *))
{
    return emu_run_child([kernel] {
        uint16_t *g;
        cudaMalloc((void **)&g, 4096);
        TS_LAUNCH(kernel, 1, 32, 0, 0, (const uint16_t *)g);
        cudaDeviceSynchronize();
    });
}

static void test_ldmatrix_rules_abort(void)
{
    emu_child r = run_bad(ldmatrix_misaligned_kernel);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "is not 16-byte aligned"), "misaligned row");
    CHECK(emu_err_has(r, "ldmatrix.x4 at") && emu_err_has(r, "test_emu_mma.cu"), "call site");
    r = run_bad(ldmatrix_global_kernel);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "not in the block's shared memory"), "global row");
    r = run_bad(ldmatrix_partial_kernel);
    CHECK(emu_died_by_abort(r) && emu_err_has(r, "lane 5"), "missing lane (signal %d, exit %d)", r.sig, r.exit_code);
}

int main(void)
{
    RUN(test_ldmatrix_rules_abort);
    return test_summary();
}
