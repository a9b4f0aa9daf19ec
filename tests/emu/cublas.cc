/* cublas.cc — the cuBLAS subset on the CPU: GEMMs with cuBLAS's exact semantics.
 *
 * Column-major, as cuBLAS: C (m x n, ldc) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C,
 * op(X) = X or X^T (CUBLAS_OP_C = T for real types); when beta == 0, C is not read (so NaN
 * garbage in C does not propagate). Inputs are converted to float and accumulated in
 * float, k ascending; the fast compute types round the fp32 inputs first to what they
 * allow (_FAST_16F to fp16, _FAST_16BF to bf16, _FAST_TF32 and CUBLAS_TF32_TENSOR_OP_MATH
 * to tf32), so a tolerance that holds here holds for the GPU's choice too. Supported, as in
 * cuBLAS's cublasGemmEx table: compute 32F with A/B 16F (C 16F or 32F), 16BF (C 16BF or
 * 32F) or 32F (C 32F); the fast types with 32F only. Anything else: NOT_SUPPORTED.
 *
 * Each call is one op in the handle's stream (recorded when capturing): alpha and beta are
 * read at the call (host pointer mode) or when the op runs (device pointer mode). Matrix
 * ranges are checked against the live allocations: out of bounds would fault on a GPU, so
 * it aborts. The op converts op(A) and op(B) to float, then rows of C are spread over the
 * emulator's worker pool.
 */
#include "internal.h"

#include <cublas_v2.h>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace emu {

namespace {

enum rounding { ROUND_NONE, ROUND_F16, ROUND_BF16, ROUND_TF32 };

float round_input(float x, rounding r)
{
    switch (r) {
    case ROUND_F16: return __half2float(__float2half_rn(x));
    case ROUND_BF16: return __bfloat162float(__float2bfloat16_rn(x));
    case ROUND_TF32: {
        uint32_t u;
        memcpy(&u, &x, 4);
        if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu; /* nearest even, 10 bits */
        memcpy(&x, &u, 4);
        return x;
    }
    default: return x;
    }
}

float load(cudaDataType t, const void *p, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

void store(cudaDataType t, void *p, size_t i, float v)
{
    switch (t) {
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

const char *type_name(cudaDataType t)
{
    switch (t) {
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    default: return "an unsupported cudaDataType";
    }
}

struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const float *alpha_dev, *beta_dev; /* device pointer mode: read when run */
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc; /* batch strides, elements */
    int batch;
    rounding round;
};

/* count elements of type t, `stride` elements apart from element `first` of p, as floats
 * rounded to what the compute type allows. The type switch sits outside the loops. */
void load_run(float *dst, cudaDataType t, const void *p, size_t first, size_t stride, int count, rounding r)
{
    switch (t) {
    case CUDA_R_16F: {
        const __half *s = (const __half *)p + first;
        for (int i = 0; i < count; i++) dst[i] = __half2float(s[(size_t)i * stride]);
        break;
    }
    case CUDA_R_16BF: { /* a bf16 is the upper half of the float it stands for */
        const uint16_t *s = (const uint16_t *)p + first;
        for (int i = 0; i < count; i++) {
            uint32_t u = (uint32_t)s[(size_t)i * stride] << 16;
            memcpy(&dst[i], &u, 4);
        }
        break;
    }
    default: {
        const float *s = (const float *)p + first;
        for (int i = 0; i < count; i++) dst[i] = s[(size_t)i * stride];
        break;
    }
    }
    if (r != ROUND_NONE)
        for (int i = 0; i < count; i++) dst[i] = round_input(dst[i], r);
}

/* op(X)(r, c) of a column-major X with leading dimension ld. */
inline size_t at_index(bool trans, int r, int c, int ld)
{
    return trans ? (size_t)c + (size_t)r * ld : (size_t)r + (size_t)c * ld;
}

/* Eight rows of op(A) side by side (GCC vector extensions: portable, and vectorised at -O2
 * where the plain loops are not). */
typedef float v8f __attribute__((vector_size(32)));

/* C = alpha op(A) op(B) + beta C. Every element is one float accumulation over k ascending,
 * acc += a(i,p) * b(p,j) from 0, then alpha * acc (+ beta * C).
 *
 * op(B)'s columns are converted once, each contiguous over k. Tasks are 8 rows of C x up to
 * 128 columns: a task converts its 8 rows of op(A) into k vectors of 8 (row r in lane r, so
 * the source is read once, in parallel, and never whole into memory), then runs four
 * columns at a time: four independent vector accumulations of 8 rows each. */
void run_one(const gemm_args &g, const void *A, const void *B, void *C, float alpha, float beta)
{
    const int m = g.m, n = g.n, k = g.k;
    const bool ta = g.ta != CUBLAS_OP_N, tb = g.tb != CUBLAS_OP_N;
    enum { ROWS = 8, COLS = 128, BCOLS = 16 };
    std::unique_ptr<float[]> bcols(new float[(size_t)n * (size_t)k]); /* column j at j * k */
    parallel_for((size_t)(n + BCOLS - 1) / BCOLS, [&](size_t t) {
        for (int j = (int)t * BCOLS; j < n && j < (int)(t + 1) * BCOLS; j++)
            load_run(&bcols[(size_t)j * k], g.bt, B, at_index(tb, 0, j, g.ldb), tb ? (size_t)g.ldb : 1, k, g.round);
    });
    const size_t row_tasks = (size_t)(m + ROWS - 1) / ROWS, col_tasks = (size_t)(n + COLS - 1) / COLS;
    parallel_for(row_tasks * col_tasks, [&](size_t t) {
        const int i0 = (int)(t / col_tasks) * ROWS, nr = std::min(m - i0, (int)ROWS);
        const int j0 = (int)(t % col_tasks) * COLS, j1 = std::min(n, j0 + COLS);
        static thread_local std::vector<float> row, at; /* grow to the largest k, then stay */
        row.resize((size_t)k);
        at.resize((size_t)k * ROWS);
        std::fill(at.begin(), at.end(), 0.0f); /* rows past m stay 0 and are never stored */
        for (int r = 0; r < nr; r++) {
            load_run(row.data(), g.at, A, at_index(ta, i0 + r, 0, g.lda), ta ? 1 : (size_t)g.lda, k, g.round);
            for (int p = 0; p < k; p++) at[(size_t)p * ROWS + r] = row[p];
        }
        for (int j = j0; j < j1; j += 4) {
            const int nj = std::min(4, j1 - j);
            const float *b[4];
            for (int c = 0; c < 4; c++) b[c] = &bcols[(size_t)(j + (c < nj ? c : 0)) * k];
            v8f acc[4] = {};
            for (int p = 0; p < k; p++) {
                v8f a;
                memcpy(&a, &at[(size_t)p * ROWS], sizeof a);
                acc[0] += a * b[0][p];
                acc[1] += a * b[1][p];
                acc[2] += a * b[2][p];
                acc[3] += a * b[3][p];
            }
            for (int c = 0; c < nj; c++)
                for (int r = 0; r < nr; r++) {
                    size_t ci = (size_t)(i0 + r) + (size_t)(j + c) * g.ldc;
                    float v = alpha * acc[c][r];
                    if (beta != 0.0f) v += beta * load(g.ct, C, ci);
                    store(g.ct, C, ci, v);
                }
        }
    });
}

void run_gemm(const gemm_args &g)
{
    float alpha = g.alpha_dev ? *g.alpha_dev : g.alpha, beta = g.beta_dev ? *g.beta_dev : g.beta;
    for (int bi = 0; bi < g.batch; bi++) {
        const char *A = (const char *)g.A + (size_t)bi * g.sa * type_size(g.at);
        const char *B = (const char *)g.B + (size_t)bi * g.sb * type_size(g.bt);
        char *C = (char *)g.C + (size_t)bi * g.sc * type_size(g.ct);
        run_one(g, A, B, C, alpha, beta);
    }
}

/* Elements spanned by a column-major rows x cols matrix with leading dimension ld. */
size_t span(int rows, int cols, int ld) { return rows && cols ? (size_t)(cols - 1) * ld + rows : 0; }

void check_range(const char *api, const char *what, const void *p, int rows, int cols, int ld, long long stride,
                 int batch, cudaDataType t)
{
    size_t elems = span(rows, cols, ld);
    if (!elems) return;
    size_t total = (size_t)(batch - 1) * (size_t)stride + elems;
    char label[128];
    snprintf(label, sizeof label, "%s: matrix %s (%d x %d, ld %d, %d batches)", api, what, rows, cols, ld, batch);
    if (!check_device_span(p, total * type_size(t), false, label))
        fail("%s: reading or writing it would fault on a GPU", label);
}

cublasStatus_t gemm(cublasHandle_t h, const char *api, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const void *alpha, const void *A, cudaDataType at, int lda, long long sa, const void *B,
                    cudaDataType bt, int ldb, long long sb, const void *beta, void *C, cudaDataType ct, int ldc,
                    long long sc, int batch, cublasComputeType_t compute)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    auto bad_op = [](cublasOperation_t o) { return o != CUBLAS_OP_N && o != CUBLAS_OP_T && o != CUBLAS_OP_C; };
    int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (bad_op(ta) || bad_op(tb) || m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) ||
        ldb < std::max(1, b_rows) || ldc < std::max(1, m) || !alpha || !beta) {
        warn("%s: invalid value (m %d n %d k %d, lda %d ldb %d ldc %d, batch %d)", api, m, n, k, lda, ldb, ldc, batch);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    rounding round = ROUND_NONE;
    bool types_ok;
    switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
        types_ok = at == bt && ((at == CUDA_R_32F && ct == CUDA_R_32F) ||
                                ((at == CUDA_R_16F || at == CUDA_R_16BF) && (ct == at || ct == CUDA_R_32F)));
        if (compute == CUBLAS_COMPUTE_32F && at == CUDA_R_32F && (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH)
            round = ROUND_TF32;
        break;
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        types_ok = at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F;
        round = compute == CUBLAS_COMPUTE_32F_FAST_16F ? ROUND_F16
                : compute == CUBLAS_COMPUTE_32F_FAST_16BF ? ROUND_BF16
                                                          : ROUND_TF32;
        break;
    default: types_ok = false; break;
    }
    if (!types_ok) {
        warn("%s: A %s, B %s, C %s with compute type %d is not supported (cuBLAS's table: compute 32F with 16F/16BF "
             "inputs and C of the same type or 32F, or all 32F)", api, type_name(at), type_name(bt), type_name(ct),
             (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    check_range(api, "C", C, m, n, ldc, sc, batch, ct);
    if (k > 0) {
        check_range(api, "A", A, a_rows, ta == CUBLAS_OP_N ? k : m, lda, sa, batch, at);
        check_range(api, "B", B, b_rows, tb == CUBLAS_OP_N ? n : k, ldb, sb, batch, bt);
    }
    auto g = std::make_shared<gemm_args>();
    *g = gemm_args{ ta, tb, m, n, k, 0.0f, 0.0f, nullptr, nullptr, A, B, C, at, bt, ct, lda, ldb, ldc, sa, sb, sc,
                    batch, round };
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
        g->alpha_dev = (const float *)alpha;
        g->beta_dev = (const float *)beta;
    } else {
        g->alpha = *(const float *)alpha;
        g->beta = *(const float *)beta;
    }
    cudaError_t e = enqueue(h->stream, op{ [g] { run_gemm(*g); }, api });
    if (e != cudaSuccess) {
        warn("%s: %s", api, cudaGetErrorString(e));
        set_error(e);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

} // namespace emu

using namespace emu;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!version) return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !check_device_span(workspace, bytes, false, "cublasSetWorkspace")) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc)
{
    return gemm(handle, "cublasSgemm", transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0,
                beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long int strideA, const float *B, int ldb, long long int strideB,
                                         const float *beta, float *C, int ldc, long long int strideC, int batchCount)
{
    return gemm(handle, "cublasSgemmStridedBatched", transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B,
                CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    return gemm(handle, "cublasGemmEx", transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    return gemm(handle, "cublasGemmStridedBatchedEx", transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType);
}

/* One GemmEx per batch entry; the pointer arrays are read at the call (they live in device
 * memory on a GPU, here they are plain memory either way). */
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *const Aarray[], cudaDataType Atype,
                                   int lda, const void *const Barray[], cudaDataType Btype, int ldb, const void *beta,
                                   void *const Carray[], cudaDataType Ctype, int ldc, int batchCount,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (batchCount < 0 || (batchCount && (!Aarray || !Barray || !Carray))) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < batchCount; i++) {
        cublasStatus_t s = gemm(handle, "cublasGemmBatchedEx", transa, transb, m, n, k, alpha, Aarray[i], Atype, lda,
                                0, Barray[i], Btype, ldb, 0, beta, Carray[i], Ctype, ldc, 0, 1, computeType);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
