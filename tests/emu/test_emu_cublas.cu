/* test_emu_cublas.cu — the emulator's cuBLAS subset against plain loops: every transpose,
 * odd m/n/k, leading dimensions larger than the rows, each supported type combination and
 * compute type, beta == 0 ignoring NaN garbage in C, strided batches, stream order and
 * graph capture, the errors cuBLAS returns, and an out-of-bounds matrix aborting.
 */
#include "kernels/common.cuh"
#include "tests/emu/emu_test.h"

#include <cublas_v2.h>

#include <atomic>
#include <thread>
#include <vector>

static float round_to(cudaDataType t, float v)
{
    if (t == CUDA_R_16F) return __half2float(__float2half_rn(v));
    if (t == CUDA_R_16BF) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

static size_t tsize(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

static void put(cudaDataType t, std::vector<unsigned char> &buf, size_t i, float v)
{
    if (t == CUDA_R_16F) ((__half *)buf.data())[i] = __float2half_rn(v);
    else if (t == CUDA_R_16BF) ((__nv_bfloat16 *)buf.data())[i] = __float2bfloat16_rn(v);
    else ((float *)buf.data())[i] = v;
}

static float get(cudaDataType t, const std::vector<unsigned char> &buf, size_t i)
{
    if (t == CUDA_R_16F) return __half2float(((const __half *)buf.data())[i]);
    if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)buf.data())[i]);
    return ((const float *)buf.data())[i];
}

struct gemm_case {
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    cudaDataType ab, c;
    cublasComputeType_t compute;
    float alpha, beta;
};

/* Runs one GemmEx / GemmStridedBatchedEx and compares with a double-precision loop over
 * the same (rounded) inputs. Returns the number of wrong elements. */
static int run_case(cublasHandle_t h, const gemm_case &g)
{
    const int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    const int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    const int lda = ar + 3, ldb = br + 1, ldc = g.m + 2;
    const long long sa = (long long)lda * ac + 5, sb = (long long)ldb * bc + 7, sc = (long long)ldc * g.n + 9;
    std::vector<unsigned char> A(sa * g.batch * tsize(g.ab)), B(sb * g.batch * tsize(g.ab)),
        C(sc * g.batch * tsize(g.c));
    uint64_t s = 99 + g.m * 7 + g.k;
    auto rnd = [&s] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((int)(s >> 33) % 2001 - 1000) / 1000.0f;
    };
    for (size_t i = 0; i < A.size() / tsize(g.ab); i++) put(g.ab, A, i, rnd());
    for (size_t i = 0; i < B.size() / tsize(g.ab); i++) put(g.ab, B, i, rnd());
    for (size_t i = 0; i < C.size() / tsize(g.c); i++) put(g.c, C, i, g.beta == 0.0f ? NAN : rnd());
    void *dA, *dB, *dC;
    cudaMalloc(&dA, A.size());
    cudaMalloc(&dB, B.size());
    cudaMalloc(&dC, C.size());
    cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C.data(), C.size(), cudaMemcpyHostToDevice);
    cublasStatus_t st;
    if (g.batch == 1)
        st = cublasGemmEx(h, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, dA, g.ab, lda, dB, g.ab, ldb, &g.beta, dC, g.c, ldc,
                          g.compute, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, g.ta, g.tb, g.m, g.n, g.k, &g.alpha, dA, g.ab, lda, sa, dB, g.ab, ldb, sb,
                                        &g.beta, dC, g.c, ldc, sc, g.batch, g.compute, CUBLAS_GEMM_DEFAULT);
    std::vector<unsigned char> out(C.size());
    cudaMemcpy(out.data(), dC, out.size(), cudaMemcpyDeviceToHost);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "    status %s\n", cublasGetStatusName(st));
        return 1;
    }
    cudaDataType fast = g.compute == CUBLAS_COMPUTE_32F_FAST_16F    ? CUDA_R_16F
                        : g.compute == CUBLAS_COMPUTE_32F_FAST_16BF ? CUDA_R_16BF
                                                                    : CUDA_R_32F;
    double tol = g.c == CUDA_R_32F ? (fast == CUDA_R_32F ? 1e-5 : 1e-2) : g.c == CUDA_R_16F ? 2e-3 : 1e-2;
    if (g.compute == CUBLAS_COMPUTE_32F_FAST_TF32) tol = 2e-3;
    int bad = 0;
    for (int b = 0; b < g.batch; b++)
        for (int i = 0; i < g.m; i++)
            for (int j = 0; j < g.n; j++) {
                double acc = 0;
                for (int p = 0; p < g.k; p++) {
                    size_t ai = g.ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * lda : (size_t)p + (size_t)i * lda;
                    size_t bi = g.tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * ldb : (size_t)j + (size_t)p * ldb;
                    acc += (double)round_to(fast, get(g.ab, A, b * sa + ai)) *
                           (double)round_to(fast, get(g.ab, B, b * sb + bi));
                }
                size_t ci = b * sc + (size_t)i + (size_t)j * ldc;
                double want = g.alpha * acc + (g.beta != 0.0f ? g.beta * get(g.c, C, ci) : 0.0);
                double got = get(g.c, out, ci);
                if (!(fabs(got - want) <= tol * (1.0 + fabs(want))) && bad++ < 3)
                    fprintf(stderr, "    m%d n%d k%d op %d/%d batch %d: C[%d,%d] = %g, want %g\n", g.m, g.n, g.k, g.ta,
                            g.tb, b, i, j, got, want);
            }
    /* elements between the matrices (ldc padding, batch gaps) are untouched */
    for (size_t i = 0; i < C.size(); i++) {
        size_t e = i / tsize(g.c), in_batch = e % sc, col = in_batch / ldc, row = in_batch % ldc;
        bool inside = e / sc < (size_t)g.batch && col < (size_t)g.n && row < (size_t)g.m;
        if (!inside && out[i] != C[i] && bad++ < 3) fprintf(stderr, "    byte %zu outside C changed\n", i);
    }
    return bad;
}

static void test_gemm_ex_all_transposes_and_types(void)
{
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "create");
    const cublasOperation_t ops[] = { CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C };
    struct {
        cudaDataType ab, c;
    } types[] = { { CUDA_R_16F, CUDA_R_16F },   { CUDA_R_16F, CUDA_R_32F }, { CUDA_R_16BF, CUDA_R_16BF },
                  { CUDA_R_16BF, CUDA_R_32F }, { CUDA_R_32F, CUDA_R_32F } };
    int cases = 0;
    for (auto ta : ops)
        for (auto tb : ops)
            for (auto t : types)
                for (int beta = 0; beta < 2; beta++) {
                    gemm_case g = { ta, tb, 37, 29, 41, 1, t.ab, t.c, CUBLAS_COMPUTE_32F, 1.5f, beta ? 0.5f : 0.0f };
                    int bad = run_case(h, g);
                    CHECK(bad == 0, "op %d/%d types %d/%d beta %g: %d wrong", ta, tb, t.ab, t.c, g.beta, bad);
                    cases++;
                }
    const cublasComputeType_t fast[] = { CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_COMPUTE_32F_FAST_16BF,
                                         CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_COMPUTE_32F_PEDANTIC };
    for (auto ct : fast) {
        gemm_case g = { CUBLAS_OP_T, CUBLAS_OP_N, 17, 33, 64, 1, CUDA_R_32F, CUDA_R_32F, ct, 1.0f, 0.0f };
        CHECK(run_case(h, g) == 0, "compute type %d", ct);
    }
    /* one-element and k = 1 edges */
    gemm_case e1 = { CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 1, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 1.0f, 0.0f };
    gemm_case e2 = { CUBLAS_OP_N, CUBLAS_OP_T, 5, 3, 1, 1, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2.0f, 1.0f };
    CHECK(run_case(h, e1) == 0 && run_case(h, e2) == 0, "edge shapes");
    cublasDestroy(h);
    printf("     %d GemmEx cases\n", cases);
}

static void test_strided_batched(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    gemm_case g1 = { CUBLAS_OP_T, CUBLAS_OP_N, 19, 23, 31, 3, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 1.0f, 0.0f };
    gemm_case g2 = { CUBLAS_OP_N, CUBLAS_OP_T, 8, 40, 16, 4, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0.5f, 2.0f };
    gemm_case g3 = { CUBLAS_OP_N, CUBLAS_OP_N, 33, 1, 65, 2, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 1.0f, 1.0f };
    CHECK(run_case(h, g1) == 0, "half -> float, 3 batches");
    CHECK(run_case(h, g2) == 0, "bf16, 4 batches");
    CHECK(run_case(h, g3) == 0, "float, 2 batches, n = 1");
    cublasDestroy(h);
}

/* cublasSgemm: column-major C = A^T B, checked on a tiny known product. */
static void test_sgemm(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    /* A (2 x 3, lda 2) = [[1 3 5] [2 4 6]], B (2 x 2) = [[1 0] [0 1]]: A^T B = A^T (3 x 2) */
    float hA[6] = { 1, 2, 3, 4, 5, 6 }, hB[4] = { 1, 0, 0, 1 }, hC[6];
    float *A, *B, *C;
    cudaMalloc((void **)&A, sizeof hA);
    cudaMalloc((void **)&B, sizeof hB);
    cudaMalloc((void **)&C, sizeof hC);
    cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice);
    float one = 1.0f, zero = 0.0f;
    CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 3, 2, 2, &one, A, 2, B, 2, &zero, C, 3) == CUBLAS_STATUS_SUCCESS,
          "sgemm");
    cudaMemcpy(hC, C, sizeof hC, cudaMemcpyDeviceToHost);
    const float want[6] = { 1, 3, 5, 2, 4, 6 };
    for (int i = 0; i < 6; i++) CHECK(hC[i] == want[i], "C[%d] = %g, want %g", i, hC[i], want[i]);
    CHECK(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 3, 2, &one, B, 2, 0, A, 2, 0, &zero, C, 2, 0, 1) ==
              CUBLAS_STATUS_SUCCESS,
          "sgemm strided batched");
    cudaMemcpy(hC, C, sizeof hC, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 6; i++) CHECK(hC[i] == hA[i], "I * A: C[%d] = %g", i, hC[i]);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cublasDestroy(h);
}

static void test_status_codes(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    float *d;
    cudaMalloc((void **)&d, 64 * 64 * sizeof(float));
    float one = 1.0f;
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 4, d, CUDA_R_32F, 8, &one, d,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
          "lda < m accepted");
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 8, 8, &one, d, CUDA_R_32F, 8, d, CUDA_R_32F, 8, &one, d,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
          "m < 0 accepted");
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_16F, 8, d, CUDA_R_16F, 8, &one, d,
                       CUDA_R_16F, 8, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
          "fp16 inputs with FAST_TF32 accepted");
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_16F, 8, d, CUDA_R_16BF, 8, &one, d,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
          "mixed A/B types accepted");
    CHECK(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 8, d, CUDA_R_32F, 8, &one, d,
                       CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED,
          "null handle accepted");
    CHECK(strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0, "status name");
    cublasMath_t mode;
    cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
    cublasGetMathMode(h, &mode);
    CHECK(mode == CUBLAS_TF32_TENSOR_OP_MATH, "math mode");
    cudaStream_t s;
    cudaStreamCreate(&s);
    cublasSetStream(h, s);
    cudaStream_t got;
    cublasGetStream(h, &got);
    CHECK(got == s, "stream");
    cudaStreamDestroy(s);
    cudaFree(d);
    cublasDestroy(h);
}

/* A matrix that runs past its allocation would fault on a GPU: abort. */
static void test_out_of_bounds_aborts(void)
{
    emu_child r = emu_run_child([] {
        cublasHandle_t h;
        cublasCreate(&h);
        float *a, *c;
        cudaMalloc((void **)&a, 16 * 16 * sizeof(float));
        cudaMalloc((void **)&c, 16 * 16 * sizeof(float));
        float one = 1.0f;
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 16, 16, 16, &one, a, 32, a, 16, &one, c, 16); /* lda 32: past end */
        cudaDeviceSynchronize();
    });
    CHECK(emu_died_by_abort(r), "did not abort (signal %d exit %d)", r.sig, r.exit_code);
    CHECK(emu_err_has(r, "cublasSgemm: matrix A (16 x 16, ld 32"), "message");
    CHECK(emu_err_has(r, "past the end"), "reason");
}

/* The GEMM runs in its stream's order (asynchronously) and can be captured into a graph. */
static void test_stream_order_and_capture(void)
{
    cublasHandle_t h;
    cublasCreate(&h);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cublasSetStream(h, s);
    const int n = 8;
    float *A, *B, *C, *pinned;
    cudaMalloc((void **)&A, n * n * sizeof(float));
    cudaMalloc((void **)&B, n * n * sizeof(float));
    cudaMalloc((void **)&C, n * n * sizeof(float));
    cudaMallocHost((void **)&pinned, n * n * sizeof(float));
    std::vector<float> eye(n * n, 0.0f), h2(n * n);
    for (int i = 0; i < n; i++) eye[i * n + i] = 1.0f;
    for (int i = 0; i < n * n; i++) pinned[i] = 1.0f;
    cudaMemcpy(B, eye.data(), n * n * sizeof(float), cudaMemcpyHostToDevice);
    float one = 1.0f, zero = 0.0f;
    gate g;
    cudaLaunchHostFunc(s, wait_gate, &g);
    cudaMemcpyAsync(A, pinned, n * n * sizeof(float), cudaMemcpyHostToDevice, s);
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, n, B, n, &zero, C, n);
    for (int i = 0; i < n * n; i++) pinned[i] = 3.0f;
    g.open = 1;
    cudaStreamSynchronize(s);
    cudaMemcpy(h2.data(), C, n * n * sizeof(float), cudaMemcpyDeviceToHost);
    CHECK(h2[0] == 3.0f && h2[n * n - 1] == 3.0f, "C = %g: the GEMM did not run in stream order", h2[0]);

    cudaGraph_t graph;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaMemcpyAsync(A, pinned, n * n * sizeof(float), cudaMemcpyHostToDevice, s);
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, n, B, n, &zero, C, n);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "capture failed");
    cudaGraphExec_t exec;
    cudaGraphInstantiate(&exec, graph, 0);
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < n * n; i++) pinned[i] = 10.0f + rep;
        cudaGraphLaunch(exec, s);
        cudaStreamSynchronize(s);
        cudaMemcpy(h2.data(), C, n * n * sizeof(float), cudaMemcpyDeviceToHost);
        CHECK(h2[5] == 10.0f + rep, "replay %d: C = %g", rep, h2[5]);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFreeHost(pinned);
    cudaStreamDestroy(s);
    cublasDestroy(h);
}

/* Speed report (no bound: the machine varies): a prefill-sized square product and a
 * decode-shaped one, the LM head of a 49152-token vocabulary over 4 rows (what the
 * emulated backend's tests run most). Best of 3. */
static void gemm_speed(const char *what, cudaDataType t, int m, int n, int k)
{
    cublasHandle_t h;
    cublasCreate(&h);
    void *A, *B;
    float *C;
    cudaMalloc(&A, (size_t)m * k * 2);
    cudaMalloc(&B, (size_t)k * n * 2);
    cudaMalloc((void **)&C, (size_t)m * n * sizeof(float));
    cudaMemset(A, 0, (size_t)m * k * 2);
    cudaMemset(B, 0, (size_t)k * n * 2);
    float one = 1.0f, zero = 0.0f;
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = emu_now_us();
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, t, k, B, t, k, &zero, C, CUDA_R_32F, m,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaDeviceSynchronize();
        best = std::min(best, emu_now_us() - t0);
    }
    printf("     GemmEx %dx%dx%d %s->fp32 (%s): %.2f ms, %.2f GFLOP/s\n", m, n, k, t == CUDA_R_16F ? "fp16" : "bf16",
           what, best / 1000, 2.0 * m * n * k / best / 1000);
    float c0;
    cudaMemcpy(&c0, C, sizeof c0, cudaMemcpyDeviceToHost);
    CHECK(c0 == 0.0f, "%s: C[0] = %g", what, c0);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cublasDestroy(h);
}

static void test_speed_report(void)
{
    gemm_speed("prefill-sized", CUDA_R_16F, 512, 512, 512);
    gemm_speed("decode LM head", CUDA_R_16BF, 49152, 4, 576);
}

int main(void)
{
    RUN(test_gemm_ex_all_transposes_and_types);
    RUN(test_strided_batched);
    RUN(test_sgemm);
    RUN(test_status_codes);
    RUN(test_out_of_bounds_aborts);
    RUN(test_stream_order_and_capture);
    RUN(test_speed_report);
    return test_summary();
}
