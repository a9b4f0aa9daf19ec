/* linear.cu — the CUDA backend's linear layers: which kernel computes y = x W^T for a
 * given weight matrix and row count, and the start-up measurement that decides it.
 *
 * Quantized weights always go to our quantized kernels (cuda_quant_gemv for 1-8 rows of
 * activations the kernel before quantized, else cuda_quant_matmul); the one choice there is
 * how the GEMV loads Q4_K weights: straight into registers ("direct") or through shared
 * memory ("staged", every other type's only way), measured per Q4_K shape at 1-8 rows as
 * below (TESSERA_CUDA_QUANT_LOADS: tune, the default on a GPU; direct, the default under
 * the emulator; staged). An F16/BF16 matrix has three
 * candidates with different strengths: our GEMV (kernels/dense_gemv.cu, CUDA cores, 1-8
 * rows: the fastest single row), our skinny GEMM (kernels/skinny_gemm.cu, tensor cores,
 * 1-16 rows) and cuBLAS's GEMM (any row count; the only choice past 16 rows). Which one
 * wins for 2-16 rows depends on the GPU and the matrix shape, so each rank measures it
 * once at start-up (cu_linear_plan), as cuBLASLt's and TensorRT's tactic selection do:
 * every distinct (type, n_in, n_out) of the model, at every row count 1..16 the step sizes
 * allow, each candidate timed over the matrices of that shape in turn (a 7B model's layers
 * hold hundreds of MiB per shape, so the calls stream from HBM as in a real step, not from
 * the L2), two rounds, best round kept. The choice is stored in each cu_linear's kern[]
 * and used by every later step and captured graph; start-up logs it.
 *
 * With b->pdl (sm_90+) our two kernels are also candidates as programmatic dependent
 * launches ("gemv+pdl", "skinny+pdl"; common.cuh, ts_pdl_wait): the GPU may start one
 * while the kernel before it (a norm, the attention, SiLU·mul: they let dependents launch
 * as soon as they start) finishes, and its first weight loads overlap that kernel's end,
 * which hides most of a launch's ramp-up in a step of ~250 small kernels. The timing runs
 * the calls back to back, so a launch's overlap with the previous call counts, as in a
 * step.
 *
 * TESSERA_CUDA_LINEAR (environment) overrides the measurement:
 *   tune   measure (the default on a GPU);
 *   fixed  GEMV for 1 row, skinny GEMM for 2-16 rows, of 1024+ inputs, both with pdl on
 *          sm_90+; cuBLAS otherwise (the default under the CUDA-on-CPU emulator, where
 *          timings mean nothing and short rows cost the emulator a fiber per idle thread);
 *   cublas cuBLAS for every dense matrix (the comparison baseline).
 * With b->pdl off (TESSERA_CUDA_PDL=off, or a GPU before sm_90) there are no pdl candidates.
 */
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include "kernels/dense_gemv.h"
#include "kernels/quant_matmul.h"
#include "kernels/skinny_gemm.h"
#include "kernels/step.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kernel_names[CU_LK_COUNT] = { "cublas",     "gemv",   "skinny", "gemv+pdl",
                                                        "skinny+pdl", "direct", "staged" };

static bool is_dense(const struct cu_linear *L) { return !cu_linear_quantized(L); }

static bool is_pdl(enum cu_linear_kernel k) { return k == CU_LK_GEMV_PDL || k == CU_LK_SKINNY_PDL; }

/* Whether kernel k can compute L for T rows from xb (16-byte alignment, row limits); a
 * quantized L: its GEMV's two ways of loading weights (direct: Q4_K only). */
static bool can_run(enum cu_linear_kernel k, const struct cu_linear *L, const void *xb, int T)
{
    if (!is_dense(L))
        return T <= QMM_GEMV_MAX_TOKENS &&
               (k == CU_LK_QMM_STAGED || (k == CU_LK_QMM_DIRECT && L->type == DT_Q4_K));
    const bool aligned = L->n_in % 8 == 0 && ((uintptr_t)L->w | (uintptr_t)xb) % 16 == 0;
    switch (k) {
    case CU_LK_CUBLAS: return true;
    case CU_LK_GEMV:
    case CU_LK_GEMV_PDL: return aligned && T <= DENSE_GEMV_MAX_TOKENS;
    case CU_LK_SKINNY:
    case CU_LK_SKINNY_PDL: return aligned && T <= SKINNY_GEMM_MAX_TOKENS;
    default: return false;
    }
}

/* The fixed rule (TESSERA_CUDA_LINEAR=fixed); pdl: the device takes programmatic launches. */
static enum cu_linear_kernel fixed_choice(const struct cu_linear *L, int T, bool pdl)
{
    if (L->n_in < 1024 || T > SKINNY_GEMM_MAX_TOKENS) return CU_LK_CUBLAS;
    if (T == 1) return pdl ? CU_LK_GEMV_PDL : CU_LK_GEMV;
    return pdl ? CU_LK_SKINNY_PDL : CU_LK_SKINNY;
}

/* The quantized GEMV's weight loads for L at T rows: straight into registers (Q4_K) unless
 * the plan chose shared memory for this row count (the fixed choice past CU_TUNED_TOKENS). */
static int quant_direct(const struct cuda_backend *b, const struct cu_linear *L, int T)
{
    return T <= CU_TUNED_TOKENS ? L->kern[T] == CU_LK_QMM_DIRECT : b->qmm_direct;
}

/* y[:, o] = xb @ W^T with kernel k; xb in the weight's type, or for a quantized L (the
 * GEMV kernels) its activations quantized (cuda_quantize_act). */
static int run_kernel(struct cuda_backend *b, enum cu_linear_kernel k, const struct cu_linear *L, const void *xb,
                     float *y, int64_t ldy, int T)
{
    if (k == CU_LK_QMM_DIRECT || k == CU_LK_QMM_STAGED)
        return cuda_quant_gemv(L->type, L->w, L->n_in, L->n_out, xb, T, y, ldy, k == CU_LK_QMM_DIRECT, b->pdl,
                               b->stream);
    const int pdl = is_pdl(k);
    if (k == CU_LK_GEMV || k == CU_LK_GEMV_PDL)
        return cuda_dense_gemv(L->type, L->w, L->n_in, L->n_out, xb, y, ldy, T, pdl, b->stream);
    if (k == CU_LK_SKINNY || k == CU_LK_SKINNY_PDL)
        return cuda_skinny_gemm(L->type, L->w, L->n_in, L->n_out, xb, y, ldy, T, pdl, b->stream);
    /* column-major view: y^T (n_out x T, ld ldy) = W (n_in x n_out)^T . x^T (n_in x T) */
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType t = L->type == DT_F16 ? CUDA_R_16F : CUDA_R_16BF;
    cublasStatus_t s = cublasGemmEx(b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)L->n_out, T, (int)L->n_in, &one, L->w, t,
                                    (int)L->n_in, xb, t, (int)L->n_in, &zero, y, CUDA_R_32F, (int)ldy,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : (int)cudaErrorUnknown;
}

/* The input a dense L's kernel reads: the activation rows x when they are in L's type, else
 * their 16-bit copy in bufs.cast (dense_input converts them). */
static const void *dense_x(const struct cuda_backend *b, const struct cu_linear *L, const void *x)
{
    return b->w.act == L->type ? x : b->d.cast;
}

/* dense_x(b, L, x) for T rows, converting them into bufs.cast first where needed. */
static int dense_input(struct cuda_backend *b, const struct cu_linear *L, const void *x, int T, const void **xb)
{
    *xb = dense_x(b, L, x);
    return *xb == x ? 0 : cuda_convert_f32(b->d.cast, L->type, (const float *)x, (int64_t)T * L->n_in, b->stream);
}

int cu_linear_forward(struct cuda_backend *b, const struct cu_linear *L, const void *x, const void *xq, float *y,
                      int64_t ldy, int T)
{
    if (!is_dense(L) && xq)
        return cuda_quant_gemv(L->type, L->w, L->n_in, L->n_out, xq, T, y + L->col, ldy, quant_direct(b, L, T), b->pdl,
                               b->stream);
    if (!is_dense(L))
        return cuda_quant_matmul(L->type, L->w, L->n_in, L->n_out, (const float *)x, y + L->col, ldy, T, b->d.qmm_ws,
                                 b->d.qmm_ws_bytes, b->cublas, quant_direct(b, L, T), b->pdl, b->stream);
    const void *xb;
    int e = dense_input(b, L, x, T, &xb);
    if (e) return e;
    enum cu_linear_kernel k = T <= CU_TUNED_TOKENS ? (enum cu_linear_kernel)L->kern[T] : CU_LK_CUBLAS;
    if (!can_run(k, L, xb, T)) k = CU_LK_CUBLAS;
    return run_kernel(b, k, L, xb, y + L->col, ldy, T);
}

bool cu_gate_up_fused(const struct cuda_backend *b, const struct cu_layer *cl, const void *x, int T)
{
    const struct cu_linear *L = &cl->gate_up[0];
    if (!b->fuse || cl->n_gate_up != 1 || !is_dense(L) || L->col != 0 || L->n_out != 2 * b->ffn ||
        T > CU_TUNED_TOKENS)
        return false;
    const enum cu_linear_kernel k = (enum cu_linear_kernel)L->kern[T];
    return k != CU_LK_CUBLAS && can_run(k, L, dense_x(b, L, x), T);
}

int cu_gate_up_silu(struct cuda_backend *b, const struct cu_layer *cl, const void *x, void *act, int T)
{
    const struct cu_linear *L = &cl->gate_up[0];
    const void *xb;
    int e = dense_input(b, L, x, T, &xb);
    if (e) return e;
    const enum cu_linear_kernel k = (enum cu_linear_kernel)L->kern[T];
    if (k == CU_LK_GEMV || k == CU_LK_GEMV_PDL)
        return cuda_dense_gemv_silu(L->type, L->w, L->n_in, b->ffn, xb, act, b->w.act, T, is_pdl(k), b->stream);
    return cuda_skinny_gemm_silu(L->type, L->w, L->n_in, b->ffn, xb, act, b->w.act, T, is_pdl(k), b->stream);
}

/* ---- the start-up measurement --------------------------------------------------------- */

/* Every linear of the model on this rank, with the output buffer, its row pitch and the
 * most rows a step gives it. */
struct site {
    struct cu_linear *L;
    float *y;
    int64_t ldy;
    int max_rows;
};

static int collect_sites(struct cuda_backend *b, struct site *out)
{
    const struct model_config *c = &b->m->cfg;
    const int64_t qkv_dim = (int64_t)(b->nh + 2 * b->nkv) * c->head_dim;
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        struct cu_layer *cl = &b->w.layers[l];
        for (int i = 0; i < cl->n_qkv; i++) out[n++] = (struct site){ &cl->qkv[i], b->d.qkv, qkv_dim, b->Tmax };
        out[n++] = (struct site){ &cl->o, b->d.delta, c->dim, b->Tmax };
        for (int i = 0; i < cl->n_gate_up; i++) out[n++] = (struct site){ &cl->gate_up[i], b->d.gu, 2 * b->ffn, b->Tmax };
        out[n++] = (struct site){ &cl->down, b->d.delta, c->dim, b->Tmax };
    }
    if (b->rank == 0) out[n++] = (struct site){ &b->w.output, b->d.logits, c->vocab_size, b->Lmax };
    return n;
}

/* Sites measured together: the same matrix shape and row limit (an LM head of a layer
 * matrix's shape is measured on its own, as its output buffer holds fewer rows). */
static bool same_group(const struct site *a, const struct site *c)
{
    return a->L->type == c->L->type && a->L->n_in == c->L->n_in && a->L->n_out == c->L->n_out &&
           a->max_rows == c->max_rows;
}

/* One timed call of kernel k on T rows (cu_time_calls): call i on the group's matrix
 * i % n, so the calls cycle through the group's matrices. */
struct kernel_call {
    enum cu_linear_kernel k;
    const struct site *group;
    int n, T;
    const void *xb;
};

static int kernel_call(struct cuda_backend *b, int i, void *ctx)
{
    const struct kernel_call *c = (const struct kernel_call *)ctx;
    const struct site *s = &c->group[i % c->n];
    return run_kernel(b, c->k, s->L, c->xb, s->y, s->ldy, c->T);
}

/* Mean time of one call of kernel k on T rows, over 8 calls cycling through the group's
 * matrices (ms), or a negative value when a call fails. */
static float time_kernel(struct cuda_backend *b, enum cu_linear_kernel k, const struct site *group, int n, int T,
                         const void *xb, cudaEvent_t e0, cudaEvent_t e1)
{
    struct kernel_call c = { k, group, n, T, xb };
    return cu_time_calls(b, 8, kernel_call, &c, e0, e1);
}

/* "T1 gemv, T2-8 skinny, T9-16 cublas" for the log. */
static void describe(const struct cu_linear *L, int max_t, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int t = 1; t <= max_t && o < len; t++) {
        int e = t;
        while (e < max_t && L->kern[e + 1] == L->kern[t]) e++;
        const char *sep = o ? ", " : "", *name = kernel_names[L->kern[t]];
        if (e > t) o += (size_t)snprintf(buf + o, len - o, "%sT%d-%d %s", sep, t, e, name);
        else o += (size_t)snprintf(buf + o, len - o, "%sT%d %s", sep, t, name);
        t = e;
    }
}

/* Measures one shape's candidates at each row count up to max_t and stores the winners in
 * every matrix of the shape. */
static int tune_group(struct cuda_backend *b, struct site *group, int n, int max_t, char *err, size_t errlen)
{
    struct cu_linear *L0 = group[0].L;
    const void *xb = !is_dense(L0) ? b->d.qact : b->w.act == L0->type ? b->d.act : b->d.cast;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e;
    if ((e = cudaEventCreate(&e0)) || (e = cudaEventCreate(&e1))) {
        if (e0) cudaEventDestroy(e0);
        return cu_error(b, false, e, err, errlen, "creating the timing events");
    }
    int rc = 0;
    for (int T = 1; T <= max_t && !rc; T++) {
        float best[CU_LK_COUNT];
        for (int k = 0; k < CU_LK_COUNT; k++) best[k] = -1.0f;
        for (int round = 0; round < 2 && !rc; round++)
            for (int k = CU_LK_CUBLAS; k < CU_LK_COUNT; k++) {
                if (!can_run((enum cu_linear_kernel)k, L0, xb, T) || (!b->pdl && is_pdl((enum cu_linear_kernel)k)))
                    continue;
                const float ms = time_kernel(b, (enum cu_linear_kernel)k, group, n, T, xb, e0, e1);
                if (ms < 0) {
                    rc = cu_error(b, false, (int)cudaGetLastError(), err, errlen,
                                  "timing the %s kernel for a %lld x %lld matrix", kernel_names[k],
                                  (long long)L0->n_in, (long long)L0->n_out);
                    break;
                }
                if (best[k] < 0 || ms < best[k]) best[k] = ms;
            }
        int win = -1; /* the first candidate wins a tie */
        for (int k = CU_LK_CUBLAS; k < CU_LK_COUNT; k++)
            if (best[k] >= 0 && (win < 0 || best[k] < best[win])) win = k;
        if (win >= 0)
            for (int i = 0; i < n; i++) group[i].L->kern[T] = (uint8_t)win;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}

enum plan_mode { PLAN_TUNE, PLAN_FIXED, PLAN_CUBLAS };

/* TESSERA_CUDA_LINEAR, or the build's default; -1 for an unknown value. */
static int read_plan_mode(const char **name)
{
    const char *env = getenv("TESSERA_CUDA_LINEAR");
#ifdef TESSERA_EMU
    *name = env && *env ? env : "fixed";
#else
    *name = env && *env ? env : "tune";
#endif
    if (!strcmp(*name, "tune")) return PLAN_TUNE;
    if (!strcmp(*name, "fixed")) return PLAN_FIXED;
    return !strcmp(*name, "cublas") ? PLAN_CUBLAS : -1;
}

int cu_linear_plan(struct cuda_backend *b, char *err, size_t errlen)
{
    const char *name;
    const int mode = read_plan_mode(&name);
    if (mode < 0)
        return err_set(err, errlen, ERR_INVALID, "cuda: TESSERA_CUDA_LINEAR=%s: expected tune, fixed or cublas", name);
    const size_t max_sites = 7 * (size_t)b->m->cfg.n_layers + 1; /* <= 3 QKV + O + 2 gate/up + down per layer */
    struct site *sites = (struct site *)malloc(sizeof *sites * max_sites);
    struct site *group = (struct site *)malloc(sizeof *group * max_sites);
    bool *done = (bool *)calloc(max_sites, 1);
    if (!sites || !group || !done) {
        free(sites);
        free(group);
        free(done);
        return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    }
    const int ns = collect_sites(b, sites);
    int rc = 0;
    /* the quantized GEMVs' measurement reads zeros (whatever the buffer held might be NaN) */
    cudaError_t e = b->qmm_tune && b->d.qact
                        ? cudaMemset(b->d.qact, 0, cuda_quant_act_size((int64_t)b->act_width, QMM_GEMV_MAX_TOKENS))
                        : cudaSuccess;
    if (e) rc = cu_error(b, false, e, err, errlen, "clearing the quantized activations");
    for (int i = 0; i < ns && !rc; i++) {
        if (done[i]) continue;
        int n = 0;
        for (int j = i; j < ns; j++)
            if (!done[j] && same_group(&sites[i], &sites[j])) {
                group[n++] = sites[j];
                done[j] = true;
            }
        const struct cu_linear *L0 = group[0].L;
        const bool dense = is_dense(L0), q4k = L0->type == DT_Q4_K;
        const bool tune = dense ? mode == PLAN_TUNE : b->qmm_tune && q4k;
        /* the fixed choices, for every row count (and the row counts a measurement leaves) */
        for (int j = 0; j < n; j++)
            for (int T = 1; T <= CU_TUNED_TOKENS; T++)
                group[j].L->kern[T] = (uint8_t)(!dense ? (q4k && b->qmm_direct ? CU_LK_QMM_DIRECT : CU_LK_QMM_STAGED)
                                                : mode == PLAN_FIXED ? fixed_choice(group[j].L, T, b->pdl)
                                                                     : CU_LK_CUBLAS);
        const int row_cap = dense ? CU_TUNED_TOKENS : QMM_GEMV_MAX_TOKENS;
        const int max_t = group[0].max_rows < row_cap ? group[0].max_rows : row_cap;
        if (tune && (rc = tune_group(b, group, n, max_t, err, errlen))) break;
        if (!dense && !q4k) continue; /* one way to load them: nothing to say */
        char buf[256];
        describe(L0, max_t, buf, sizeof buf);
        LOG_INFO("cuda", "device %d: %s %lld x %lld (%d matri%s, %s=%s): %s", b->device, dtype_name(L0->type),
                 (long long)L0->n_in, (long long)L0->n_out, n, n == 1 ? "x" : "ces",
                 dense ? "TESSERA_CUDA_LINEAR" : "TESSERA_CUDA_QUANT_LOADS",
                 dense ? name : b->qmm_tune ? "tune" : b->qmm_direct ? "direct" : "staged", buf);
    }
    free(sites);
    free(group);
    free(done);
    return rc;
}
