/* test_kernel_mma.cu — ts_ldmatrix_x4(_trans) and ts_mma_16816 (kernels/common.cuh, the
 * tensor-core instructions of the decode attention and the skinny GEMM) against the PTX
 * ISA's documented register layouts, written out here independently of both the inline
 * PTX and the emulator's model of it (tests/emu/mma_sync.h). Under the emulator this
 * checks the model; on a GPU (scripts/gpu-check.sh runs every build/cuda/tests/test_kernel_*)
 * it checks the real instructions, lane by lane, before any kernel built on them:
 *   - ldmatrix.x4 and .x4.trans: every lane's four registers, from rows passed in an order
 *     that is not the lanes' own;
 *   - mma.sync m16n8k16, F16 and BF16 with F32 accumulators: a 16 x 16 x 16 product with
 *     B column-major (plain ldmatrix, the skinny GEMM's addressing) plus the same product
 *     with B row-major (.trans, the attention's V), onto C = 1, against a plain loop; the
 *     inputs are small dyadic numbers, so every sum is exact on both.
 * Each under the emulator's fiber-order seeds (KTEST_SEEDS).
 * What the emulator must refuse (misaligned rows, rows outside shared memory, a missing
 * lane) is tested in tests/emu/test_emu_mma.cu.
 */
#include "ktest.h"

#include "kernels/common.cuh"

/* Shared tables with 16-byte rows: ldmatrix faults on a row that is not 16-byte aligned. */
struct alignas(16) mma_rows {
    uint16_t v[32][8];
};
template <typename T> struct alignas(16) mma_tile {
    T v[16][24]; /* 48-byte rows */
};

/* Lane l passes row 31 - l of a 32 x 8 table of 16-bit values 100 * row + column (so a
 * lane's row is not its own index); every lane's four registers go to out[l][4]. */
template <bool TRANS> __global__ void ldmatrix_kernel(uint32_t *out)
{
    TS_SHARED(mma_rows, tab, );
    const int l = threadIdx.x;
    for (int c = 0; c < 8; c++) tab.v[l][c] = (uint16_t)(100 * l + c);
    __syncwarp();
    uint32_t r[4];
    if (TRANS) ts_ldmatrix_x4_trans(r, &tab.v[31 - l][0]);
    else ts_ldmatrix_x4(r, &tab.v[31 - l][0]);
    for (int i = 0; i < 4; i++) out[4 * l + i] = r[i];
}

template <bool TRANS> static int ldmatrix_wrong(void)
{
    uint32_t *d;
    cudaMalloc((void **)&d, 128 * 4);
    auto *k = ldmatrix_kernel<TRANS>;
    TS_LAUNCH(k, 1, 32, 0, 0, d);
    uint32_t h[128];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    int bad = 0;
    /* PTX: matrix i's rows come from lanes 8i..8i+7 (here table rows 31 - 8i - j); lane l
     * receives row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of each matrix (.trans:
     * rows 2 (l % 4) and 2 (l % 4) + 1, element l / 4), the lower one in the low half */
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            const unsigned g = l / 4, t = l % 4;
            const unsigned r0 = TRANS ? 2 * t : g, c0 = TRANS ? g : 2 * t;     /* the low element */
            const unsigned r1 = TRANS ? 2 * t + 1 : g, c1 = TRANS ? g : 2 * t + 1; /* the high one */
            const uint32_t want = (100 * (31 - 8 * i - r0) + c0) | (100 * (31 - 8 * i - r1) + c1) << 16;
            if (h[4 * l + i] != want && bad++ < 3)
                fprintf(stderr, "    %s lane %d r[%d] = %08x, want %08x\n", TRANS ? "trans" : "plain", l, i,
                        h[4 * l + i], want);
        }
    return bad;
}

static void test_ldmatrix_layout(void)
{
    KTEST_SEEDS(s) {
        int bad = ldmatrix_wrong<false>();
        CHECK(bad == 0, "ldmatrix.x4: %d registers wrong (seed %d)", bad, s);
        bad = ldmatrix_wrong<true>();
        CHECK(bad == 0, "ldmatrix.x4.trans: %d registers wrong (seed %d)", bad, s);
    }
}

/* C (16 x 16 F32, row-major) = 1 + 2 A (16 x 16, row-major) B^T, B given as 16 rows of 16
 * (its columns): A B once with B column-major (the addressing kernels/skinny_gemm.cu uses),
 * once with B row-major through ldmatrix .trans. */
template <typename T> __global__ void mma_kernel(const T *a, const T *bt, float *c)
{
    TS_SHARED(mma_tile<T>, ta, );
    TS_SHARED(mma_tile<T>, tb, );
    T(&sa)[16][24] = ta.v;
    T(&sb)[16][24] = tb.v;
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
    /* the same product from B^T's transpose (B row-major: row k holds B(k, 0..15)) through
     * ldmatrix .trans, added into d: C = 1 + 2 A B */
    for (int i = lane; i < 256; i += 32) sb[i / 16][i % 16] = bt[(i % 16) * 16 + i / 16];
    __syncwarp();
    ts_ldmatrix_x4_trans(rb, &sb[lane & 15][8 * (lane >> 4)]);
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
            float ab = 0.0f;
            for (int k2 = 0; k2 < 16; k2++) ab += to_f(a[r * 16 + k2]) * to_f(bt[n * 16 + k2]);
            const float want = 1.0f + 2.0f * ab;
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
    KTEST_SEEDS(s) {
        int bad = check_mma<__half>(h2f, f2h);
        CHECK(bad == 0, "f16: %d wrong (seed %d)", bad, s);
        bad = check_mma<__nv_bfloat16>(b2f, f2b);
        CHECK(bad == 0, "bf16: %d wrong (seed %d)", bad, s);
    }
}

int main(void)
{
    RUN(test_ldmatrix_layout);
    RUN(test_mma_16816);
    return test_summary();
}
