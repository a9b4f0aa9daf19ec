/* test_emu_mma.cu — ts_ldmatrix_x4 and ts_mma_16816 (kernels/common.cuh) under the
 * emulator: the registers each lane gets are PTX's documented ones (written out here from
 * the PTX ISA's tables, independently of the emulator's code), a 16 x 16 x 16 product
 * through them equals a plain loop for F16 and BF16, and what a GPU would fault on aborts
 * (a misaligned row, a row outside shared memory, a missing lane).
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <vector>

/* Lane l passes row l of a 32 x 8 table of 16-bit values 100 * row + column; every lane's
 * four registers go to out[l][4]. */
__global__ void ldmatrix_kernel(uint32_t *out)
{
    TS_SHARED(uint16_t, tab, [32][8]);
    const int l = threadIdx.x;
    for (int c = 0; c < 8; c++) tab[l][c] = (uint16_t)(100 * l + c);
    __syncwarp();
    uint32_t r[4];
    ts_ldmatrix_x4(r, &tab[l][0]);
    for (int i = 0; i < 4; i++) out[4 * l + i] = r[i];
}

static void test_ldmatrix_layout(void)
{
    uint32_t *d;
    cudaMalloc((void **)&d, 128 * 4);
    TS_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, d);
    uint32_t h[128];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    int bad = 0;
    /* PTX: matrix i's rows come from lanes 8i..8i+7; lane l receives row l / 4, elements
     * 2 (l % 4) and 2 (l % 4) + 1 of each matrix, the lower one in the low half */
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            const unsigned row = 8 * i + l / 4, c = 2 * (l % 4);
            const uint32_t want = (100 * row + c) | (100 * row + c + 1) << 16;
            if (h[4 * l + i] != want && bad++ < 3)
                fprintf(stderr, "    lane %d r[%d] = %08x, want %08x\n", l, i, h[4 * l + i], want);
        }
    CHECK(bad == 0, "%d registers wrong", bad);
}

/* C (16 x 16 F32, row-major) = A (16 x 16, row-major) B^T, B given as 16 rows of 16 (its
 * columns): one tile, the addressing kernels/skinny_gemm.cu uses. */
template <typename T> __global__ void mma_kernel(const T *a, const T *bt, float *c)
{
    TS_SHARED(T, sa, [16][24]);
    TS_SHARED(T, sb, [16][24]);
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) {
        sa[i / 16][i % 16] = a[i];
        sb[i / 16][i % 16] = bt[i];
    }
    __syncwarp();
    uint32_t ra[4], rb[4];
    ts_ldmatrix_x4(ra, &sa[lane & 15][8 * (lane >> 4)]);
    ts_ldmatrix_x4(rb, &sb[(lane & 7) + 8 * (lane >> 4)][8 * ((lane >> 3) & 1)]);
    float d[2][4] = { { 1.0f, 1.0f, 1.0f, 1.0f }, { 1.0f, 1.0f, 1.0f, 1.0f } }; /* C = 1 */
    ts_mma_16816<T>(d[0], ra, rb[0], rb[1]);
    ts_mma_16816<T>(d[1], ra, rb[2], rb[3]);
    const int g = lane / 4, t = lane % 4;
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) c[(g + 8 * (j / 2)) * 16 + 8 * h + 2 * t + j % 2] = d[h][j];
}

template <typename T> static int check_mma(float (*to_f)(T), T (*from_f)(float))
{
    std::vector<T> a(256), bt(256);
    for (int i = 0; i < 256; i++) {
        a[i] = from_f((float)((i * 7) % 13 - 6) / 4.0f);
        bt[i] = from_f((float)((i * 5) % 11 - 5) / 8.0f);
    }
    T *da, *db;
    float *dc;
    cudaMalloc((void **)&da, 512);
    cudaMalloc((void **)&db, 512);
    cudaMalloc((void **)&dc, 1024);
    cudaMemcpy(da, a.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, bt.data(), 512, cudaMemcpyHostToDevice);
    auto *k = mma_kernel<T>;
    TS_LAUNCH(k, 1, 32, 0, 0, (const T *)da, (const T *)db, dc);
    float c[256];
    cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    int bad = 0;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float want = 1.0f;
            for (int k2 = 0; k2 < 16; k2++) want += to_f(a[r * 16 + k2]) * to_f(bt[n * 16 + k2]);
            if (fabsf(c[r * 16 + n] - want) > 1e-5f && bad++ < 3)
                fprintf(stderr, "    C[%d][%d] = %g, want %g\n", r, n, c[r * 16 + n], want);
        }
    return bad;
}

static float h2f(__half x) { return __half2float(x); }
static __half f2h(float x) { return __float2half_rn(x); }
static float b2f(__nv_bfloat16 x) { return __bfloat162float(x); }
static __nv_bfloat16 f2b(float x) { return __float2bfloat16_rn(x); }

static void test_mma_16816(void)
{
    int bad = check_mma<__half>(h2f, f2h);
    CHECK(bad == 0, "f16: %d wrong", bad);
    bad = check_mma<__nv_bfloat16>(b2f, f2b);
    CHECK(bad == 0, "bf16: %d wrong", bad);
}

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
    RUN(test_ldmatrix_layout);
    RUN(test_mma_16816);
    RUN(test_ldmatrix_rules_abort);
    return test_summary();
}
