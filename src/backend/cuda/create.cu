/* create.cu — tessera_cuda_backend_create: the CUDA backend's start-up, memory plan and
 * CUDA graphs; destroy; the allocation and error helpers the other files share.
 *
 * Start-up, in order (vLLM's plan):
 *   1. device, stream, cuBLAS handle; free memory measured (free0);
 *   2. weights uploaded (weights.cu) → weight bytes = free0 - free after;
 *   3. every step buffer allocated for the largest step (max_num_batched_tokens rows,
 *      max_num_seqs logits rows), cuBLAS workspace, pinned staging; then each F16/BF16
 *      matrix shape's kernel per row count 1..16 measured over those buffers (linear.cu);
 *   4. a profiling step at max_num_batched_tokens through the real submit/wait path, over a
 *      one-block scratch KV pool (every block-table entry 0, no KV writes): whatever cuBLAS
 *      or the launchers allocate lazily is now allocated → activation bytes = the drop in
 *      free memory since 2 (kernels never allocate, so the level after the step is its peak);
 *   5. with graphs on, the largest decode graph is captured once over the scratch pool to
 *      measure a graph's memory; the reserve is that times the number of buckets;
 *   6. KV cache = gpu_memory_utilization x total - (weights + activations) - graph reserve
 *      (and never more than is free), in blocks of block_size tokens over all layers;
 *      refused with what is missing and the options to change when one max_model_len
 *      sequence does not fit; then, with TESSERA_CUDA_DECODE_ROWS=tune (the default on a
 *      GPU), the decode attention's layout per batch bucket timed over it (attention_plan.cu);
 *   7. the decode graphs captured per batch bucket (1, 2, 4, 8, 16, 24, ..., up to
 *      max_num_seqs, at most 512), within a time budget; steps larger than the last
 *      bucket run eagerly.
 * Tensor parallel: every step runs on all ranks at once (cu_group_run), the profiling step
 * through the group's submit/wait; the KV cache gets the same block count on every GPU
 * (the smallest budget's), each holding its heads' share; all keep the same graphs.
 * Any failure unwinds everything (destroy on a half-built backend is safe).
 */
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include "kernels/attention_decode.h"
#include "kernels/quant_matmul.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)
#define CUBLAS_WORKSPACE_BYTES (32u << 20) /* NVIDIA's recommendation for Hopper */
#define GRAPH_MAX_BATCH 512
/* TESSERA_CUDA_DECODE_ROWS and TESSERA_CUDA_QUANT_LOADS when unset: measured on a GPU
 * (attention_plan.cu, linear.cu); under the CUDA-on-CPU emulator, where timings mean
 * nothing, 16 heads per block and direct loads */
#ifdef TESSERA_EMU
#define DECODE_ROWS_DEFAULT "16"
#define DECODE_ROWS_OTHER "tune"
#define QUANT_LOADS_DEFAULT "direct"
#define QUANT_LOADS_OTHER "tune"
#else
#define DECODE_ROWS_DEFAULT "tune"
#define DECODE_ROWS_OTHER "16"
#define QUANT_LOADS_DEFAULT "tune"
#define QUANT_LOADS_OTHER "direct"
#endif
#define GRAPH_CAPTURE_BUDGET_S 60.0

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- helpers shared by the backend's files -------------------------------------------- */

float cu_time_calls(struct cuda_backend *b, int reps, int (*call)(struct cuda_backend *b, int i, void *ctx), void *ctx,
                    cudaEvent_t e0, cudaEvent_t e1)
{
    if (call(b, 0, ctx) || cudaEventRecord(e0, b->stream)) return -1.0f;
    for (int i = 1; i <= reps; i++)
        if (call(b, i, ctx)) return -1.0f;
    float ms = -1.0f;
    if (cudaEventRecord(e1, b->stream) || cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)) return -1.0f;
    return ms / (float)reps;
}

int cu_error(struct cuda_backend *b, bool fatal, int cuda_err, char *err, size_t errlen, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const cudaError_t e = (cudaError_t)cuda_err;
    const int code = e == cudaErrorMemoryAllocation ? ERR_NOMEM : ERR_IO;
    err_set(err, errlen, code, "cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError(); /* a non-sticky error must not surface again at the next launch */
    if (fatal && b) {
        b->broken = true;
        snprintf(b->broken_msg, sizeof b->broken_msg, "%s: %s", what, cudaGetErrorString(e));
        LOG_ERR("cuda", "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return code;
}

int cu_alloc(struct cuda_backend *b, void **out, size_t bytes, const char *what, char *err, size_t errlen)
{
    *out = NULL;
    if (b->n_allocs == b->cap_allocs) {
        int cap = b->cap_allocs ? 2 * b->cap_allocs : 256;
        void **p = (void **)realloc(b->allocs, sizeof(void *) * (size_t)cap);
        if (!p) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
        b->allocs = p;
        b->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        *out = NULL;
        return err_set(err, errlen, ERR_NOMEM,
                       "cuda: out of device memory: cudaMalloc of %.1f MiB for %s failed (%s); %.1f MiB free of %.1f GiB",
                       (double)bytes / MIB, what, cudaGetErrorString(e), (double)free_b / MIB, (double)total / GIB);
    }
    b->allocs[b->n_allocs++] = *out;
    return 0;
}

/* Frees one allocation cu_alloc made. */
static void cu_free(struct cuda_backend *b, void *p)
{
    for (int i = b->n_allocs - 1; i >= 0; i--)
        if (b->allocs[i] == p) {
            cudaFree(p);
            memmove(&b->allocs[i], &b->allocs[i + 1], sizeof(void *) * (size_t)(b->n_allocs - i - 1));
            b->n_allocs--;
            return;
        }
}

static size_t mem_free(void)
{
    size_t f = 0, t = 0;
    cudaMemGetInfo(&f, &t);
    return f;
}

/* ---- destroy -------------------------------------------------------------------------- */

static void destroy_graphs(struct cuda_backend *b)
{
    for (int i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graphs[i].exec);
    free(b->graphs);
    b->graphs = NULL;
    b->n_graphs = 0;
}

/* Frees one rank (safe on a half-built one); its device must be current. */
static void destroy_rank(struct cuda_backend *b)
{
    if (!b) return;
    if (b->stream) cudaStreamSynchronize(b->stream);
    if (b->rank == 0 && b->timed_steps > 1)
        LOG_INFO("cuda", "%ld steps: GPU busy %.1f ms, idle between steps %.1f ms (%.2f%% of the step time)",
                 b->timed_steps, b->busy_ms, b->idle_ms,
                 b->busy_ms > 0 ? 100.0 * b->idle_ms / (b->busy_ms + b->idle_ms) : 0.0);
    destroy_graphs(b);
    if (b->cublas) cublasDestroy(b->cublas);
    if (b->ev_done) cudaEventDestroy(b->ev_done);
    for (int i = 0; i < 2; i++) {
        if (b->ev_start[i]) cudaEventDestroy(b->ev_start[i]);
        if (b->ev_end[i]) cudaEventDestroy(b->ev_end[i]);
    }
    for (int i = b->n_allocs - 1; i >= 0; i--) cudaFree(b->allocs[i]);
    free(b->allocs);
    if (b->h_staging) cudaFreeHost(b->h_staging);
    if (b->h_samples) cudaFreeHost(b->h_samples);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b->h_bias_ids);
    free(b->h_bias_vals);
    free(b->h_bias_start);
    free(b->h_logits);
    free(b->w.layers);
    free(b->kv);
    free(b);
}

static void cu_destroy(void *impl)
{
    struct cu_group *g = (struct cu_group *)impl;
    if (!g) return;
    cu_group_stop(g); /* the workers first: nothing may use a rank being freed */
    for (int r = g->world - 1; r >= 0; r--) {
        if (!g->ranks[r]) continue;
        cudaSetDevice(g->ranks[r]->device);
        destroy_rank(g->ranks[r]);
    }
    free(g);
}

static const struct backend_ops cu_ops = { cu_submit, cu_wait, cu_logits, cu_destroy };

/* ---- configuration checks ------------------------------------------------------------- */

static int check_model(const struct model_config *c, char *err, size_t errlen)
{
    if (c->head_dim != 64 && c->head_dim != 96 && c->head_dim != 128)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: head_dim %d is not supported (the attention kernels take 64, 96 and 128)", c->head_dim);
    if (c->qk_norm && c->head_dim == 96)
        return err_set(err, errlen, ERR_UNSUPPORTED, "cuda: q/k norm with head_dim 96 is not supported");
    if (c->qk_norm && c->qkv_bias)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: a QKV bias together with q/k norm is not supported (the bias is added after the norm)");
    if (c->vocab_size > SAMPLING_MAX_VOCAB)
        return err_set(err, errlen, ERR_UNSUPPORTED, "cuda: vocabulary of %d exceeds the sampler's %d",
                       c->vocab_size, SAMPLING_MAX_VOCAB);
    return 0;
}

static int check_config(const struct backend_config *cfg, char *err, size_t errlen)
{
    const int bs = cfg->block_size;
    if (bs < 16 || bs > 256 || (bs & (bs - 1)))
        return err_set(err, errlen, ERR_INVALID,
                       "cuda: --block-size %d: the CUDA attention kernels need a power of two from 16 to 256", bs);
    if (!cfg->kv_dtype_auto && cfg->kv_dtype == KV_F32)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: --kv-cache-dtype f32 is not supported on the GPU (use auto, bf16, fp16 or fp8)");
    if (cfg->max_num_seqs < 1 || cfg->max_num_batched_tokens < 1 || cfg->max_model_len < 1)
        return err_set(err, errlen, ERR_INVALID, "cuda: max_num_seqs, max_num_batched_tokens and max_model_len must be > 0");
    if (!(cfg->gpu_memory_utilization > 0.0 && cfg->gpu_memory_utilization <= 1.0))
        return err_set(err, errlen, ERR_RANGE, "cuda: --gpu-memory-utilization %g outside (0, 1]",
                       cfg->gpu_memory_utilization);
    return 0;
}

/* KV heads split over `world` GPUs: whole heads per GPU, or, with fewer KV heads than GPUs,
 * each one replicated on world / n_kv_heads of them. */
static bool kv_splits(int n_kv_heads, int world) { return n_kv_heads % world == 0 || world % n_kv_heads == 0; }

/* Whether the model splits over `world` GPUs: whole query heads and KV heads (or KV heads
 * replicated) and an equal share of the MLP per GPU, the O and down projections' column
 * shares whole blocks of their stored types. */
static int check_split(const struct model *m, int world, char *err, size_t errlen)
{
    const struct model_config *c = &m->cfg;
    if (world == 1) return 0;
    if (c->n_heads % world || !kv_splits(c->n_kv_heads, world)) {
        char fits[64] = "none: one GPU";
        for (int t = 2, n = 0; t <= CU_MAX_RANKS; t++)
            if (c->n_heads % t == 0 && kv_splits(c->n_kv_heads, t) && c->ffn_dim % t == 0)
                n += snprintf(fits + n, sizeof fits - (size_t)n, "%s%d", n ? ", " : "", t);
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: --tensor-parallel-size %d: the model's %d attention heads must be a multiple of it, "
                       "and its %d KV heads a multiple or a divisor of it (sizes that fit: %s)",
                       world, c->n_heads, c->n_kv_heads, fits);
    }
    if (c->ffn_dim % world)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "cuda: --tensor-parallel-size %d: the MLP width %d is not a multiple of it", world, c->ffn_dim);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &m->w.layers[l];
        const int64_t qs = (int64_t)c->n_heads * c->head_dim / world, fs = c->ffn_dim / world;
        const int bo = dtype_block_elems(L->wo->type), bd = dtype_block_elems(L->w_down->type);
        if (qs % bo || fs % bd)
            return err_set(err, errlen, ERR_UNSUPPORTED,
                           "cuda: --tensor-parallel-size %d: layer %d's attention-output (%s) or down (%s) "
                           "projection does not split into whole %d-element blocks per GPU",
                           world, l, dtype_name(L->wo->type), dtype_name(L->w_down->type), qs % bo ? bo : bd);
    }
    return 0;
}

/* The index in values[0 .. n) of environment variable name's value (0 when unset or
 * empty); ERR_INVALID naming the setting and `accepted` for anything else. */
static int env_pick(const char *name, const char *const *values, int n, const char *accepted, int *index,
                    char *err, size_t errlen)
{
    const char *v = getenv(name);
    *index = 0;
    if (!v || !*v) return 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, values[i])) {
            *index = i;
            return 0;
        }
    return err_set(err, errlen, ERR_INVALID, "cuda: %s=%s: expected %s", name, v, accepted);
}

/* ---- buffers -------------------------------------------------------------------------- */

/* The canonical decode batch buckets (cu_bucket_ceil's: 1, 2, 4, then every 8), up to cap,
 * and cap itself. Writes at most max_out entries; returns the count. */
static int make_buckets(int cap, int *out, int max_out)
{
    int n = 0;
    for (int v = 1; v <= cap && n < max_out; v = cu_bucket_ceil(v + 1)) out[n++] = v;
    if (n && out[n - 1] != cap && n < max_out) out[n++] = cap;
    return n;
}

static int alloc_buffers(struct cuda_backend *b, char *err, size_t errlen)
{
    const struct model_config *c = &b->m->cfg;
    struct cu_bufs *d = &b->d;
    const size_t T = (size_t)b->Tmax, L = (size_t)b->Lmax, S = (size_t)b->Smax, dim = (size_t)c->dim;
    const size_t qd = (size_t)b->nh * c->head_dim, qkv_dim = (size_t)(b->nh + 2 * b->nkv) * c->head_dim;
    const size_t ffn = (size_t)b->ffn, vocab = (size_t)c->vocab_size;
    const size_t LR = b->rank == 0 ? L : 0; /* logits rows: rank 0 alone computes them */
    const size_t act_el = b->w.act == DT_F32 ? 4 : 2;
    int rc;
    b->act_width = dim > qd ? dim : qd;
    if (ffn > b->act_width) b->act_width = ffn;

    /* workspaces: the quantized matmul's largest need, the decode attention's for every
       batch size with its partition size */
    size_t qws = 0;
    auto need = [&](const struct cu_linear *x, int rows) {
        if (x->type == DT_F16 || x->type == DT_BF16) return;
        size_t s = cuda_quant_matmul_workspace_size(x->type, x->n_in, x->n_out, rows);
        if (s > qws) qws = s;
    };
    if (b->rank == 0) need(&b->w.output, b->Lmax);
    for (int l = 0; l < c->n_layers; l++) {
        const struct cu_layer *cl = &b->w.layers[l];
        for (int i = 0; i < cl->n_qkv; i++) need(&cl->qkv[i], b->Tmax);
        need(&cl->o, b->Tmax);
        for (int i = 0; i < cl->n_gate_up; i++) need(&cl->gate_up[i], b->Tmax);
        need(&cl->down, b->Tmax);
    }
    size_t aws = 0; /* for either layout (16 or 8 heads per block, or the kernel's auto) */
    static const int head_rows[] = { 16, 8, 0 };
    for (int rows = 1; rows <= b->Smax; rows++)
        for (int h : head_rows) {
            int part, maxp;
            cu_decode_split_for(b, rows, h, &part, &maxp);
            size_t s = cuda_attention_decode_workspace_size(rows, b->nh, c->head_dim, b->cfg.max_model_len, part, maxp);
            if (s > aws) aws = s;
        }
    d->qmm_ws_bytes = qws;
    d->att_ws_bytes = aws;
    d->cublas_ws_bytes = CUBLAS_WORKSPACE_BYTES;

    struct {
        void **p;
        size_t bytes;
        const char *what;
    } plan[] = {
        { (void **)&d->x, 4 * T * dim, "residual stream" },
        { (void **)&d->delta, 4 * T * dim, "projection output" },
        { &d->act, act_el * T * b->act_width, "activations" },
        { &d->cast, b->w.any_dense_cast ? 2 * T * b->act_width : 0, "16-bit activation copy" },
        { (void **)&d->qkv, 4 * T * qkv_dim, "QKV output" },
        { (void **)&d->q, 4 * T * qd, "rotated queries" },
        { (void **)&d->gu, 8 * T * ffn, "gate/up output" },
        { (void **)&d->xl, 4 * LR * dim, "logits-row residuals" },
        { (void **)&d->dl, 4 * LR * dim, "logits-row deltas" },
        { &d->xln, act_el * LR * dim, "final-normed rows" },
        { (void **)&d->logits, 4 * LR * vocab, "logits" },
        { &d->qmm_ws, qws, "quantized matmul workspace" },
        { &d->qact, qws ? cuda_quant_act_size((int64_t)b->act_width, QMM_GEMV_MAX_TOKENS) : 0,
          "quantized activations" },
        { &d->att_ws, aws, "decode attention workspace" },
        { &d->cublas_ws, d->cublas_ws_bytes, "cuBLAS workspace" },
        { (void **)&d->token_ids, 4 * T, "step token ids" },
        { (void **)&d->positions, 4 * T, "step positions" },
        { (void **)&d->slots, 8 * T, "step slot mapping" },
        { (void **)&d->query_start, 4 * (S + 1), "step query starts" },
        { (void **)&d->seq_lens, 4 * S, "step sequence lengths" },
        { (void **)&d->block_tables, 4 * S * (size_t)b->max_blocks, "step block tables" },
        { (void **)&d->logits_idx, 4 * L, "step logits rows" },
        { (void **)&d->samples, sizeof(struct sampling_output) * L, "sampled tokens" },
        { (void **)&d->staging, b->staging_bytes, "step input staging" },
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        if (!plan[i].bytes) continue;
        if ((rc = cu_alloc(b, plan[i].p, plan[i].bytes, plan[i].what, err, errlen))) return rc;
    }
    cudaError_t e;
    if ((e = cudaMemset(d->samples, 0xff, sizeof(struct sampling_output) * L)))
        return cu_error(b, false, e, err, errlen, "clearing the sampled-token buffer");
    if (cublasSetWorkspace(b->cublas, d->cublas_ws, d->cublas_ws_bytes) != CUBLAS_STATUS_SUCCESS)
        return err_set(err, errlen, ERR_IO, "cuda: cublasSetWorkspace failed");

    if (b->rank != 0) return 0; /* rank 0 packs every step and gets the sampled tokens back */
    /* portable: the other ranks copy their inputs from this staging too (h_src) */
    if ((e = cudaHostAlloc((void **)&b->h_staging, b->staging_bytes, cudaHostAllocPortable)) ||
        (e = cudaHostAlloc((void **)&b->h_samples, sizeof(struct sampling_output) * L, cudaHostAllocDefault)))
        return cu_error(b, false, e, err, errlen, "allocating %.1f MiB of pinned host memory",
                        (double)b->staging_bytes / MIB);
    b->h_bias_ids = (int32_t *)malloc(sizeof(int32_t) * L * SAMPLER_MAX_LOGIT_BIAS);
    b->h_bias_vals = (float *)malloc(sizeof(float) * L * SAMPLER_MAX_LOGIT_BIAS);
    b->h_bias_start = (int32_t *)malloc(sizeof(int32_t) * (L + 1));
    if (!b->h_bias_ids || !b->h_bias_vals || !b->h_bias_start)
        return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    return 0;
}

/* Points every layer's KV view at data (num_blocks blocks per layer, layer_bytes apart;
 * layer_bytes 0: all layers share the same blocks). */
static void set_kv(struct cuda_backend *b, unsigned char *data, int num_blocks, size_t layer_bytes)
{
    const struct model_config *c = &b->m->cfg;
    for (int l = 0; l < c->n_layers; l++)
        b->kv[l] = (struct kv_layer){ data + (size_t)l * layer_bytes, b->info.kv_dtype, num_blocks, b->cfg.block_size,
                                      b->nkv, c->head_dim, 1.0f, 1.0f };
}

/* ---- the profiling step --------------------------------------------------------------- */

/* One step of Tmax rows (sequences of up to max_model_len tokens) with Lmax greedy logits
 * rows, through cu_submit / cu_wait, over the one-block KV pool set up by the caller. */
static int profile_step(struct cu_group *g, char *err, size_t errlen)
{
    struct cuda_backend *b = g->ranks[0];
    const int T = b->Tmax, mml = b->cfg.max_model_len, bs = b->cfg.block_size;
    const int S = (T + mml - 1) / mml, L = b->Lmax;
    int32_t *tok = (int32_t *)calloc((size_t)T, 4), *pos = (int32_t *)calloc((size_t)T, 4);
    int64_t *slots = (int64_t *)calloc((size_t)T, 8);
    int32_t *qs = (int32_t *)calloc((size_t)S + 1, 4), *lens = (int32_t *)calloc((size_t)S, 4);
    int32_t *bt = (int32_t *)calloc((size_t)S * (size_t)b->max_blocks, 4), *li = (int32_t *)calloc((size_t)L, 4);
    struct backend_sample *smp = (struct backend_sample *)calloc((size_t)L, sizeof *smp);
    struct backend_token *out = (struct backend_token *)calloc((size_t)L, sizeof *out);
    struct sampler_params sp;
    sampler_params_default(&sp);
    sp.temperature = 0.0f;
    struct sampler *greedy = sampler_create(&sp, b->m->cfg.vocab_size);
    int rc = 0;
    if (!tok || !pos || !slots || !qs || !lens || !bt || !li || !smp || !out || !greedy) {
        rc = err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory for the profiling step");
        goto done;
    }
    for (int s = 0; s < S; s++) {
        qs[s] = s * mml;
        qs[s + 1] = s + 1 == S ? T : (s + 1) * mml;
        lens[s] = qs[s + 1] - qs[s];
        for (int t = qs[s]; t < qs[s + 1]; t++) {
            tok[t] = (int32_t)(((int64_t)t * 7919) % b->m->cfg.vocab_size);
            pos[t] = t - qs[s];
            slots[t] = -1;
        }
    }
    for (int i = 0; i < L; i++) {
        li[i] = (int32_t)((int64_t)i * T / L);
        smp[i].sampler = greedy; /* calloc'd: no mask */
        smp[i].n_logprobs = -1;
    }
    {
        struct batch pb = { T, S, tok, pos, slots, qs, lens, bt, b->max_blocks, L, li };
        (void)bs;
        if ((rc = cu_submit(g, &pb, smp, err, errlen)) || (rc = cu_wait(g, out, err, errlen))) goto done;
    }
done:
    for (int r = 0; r < g->world; r++) {
        struct cuda_backend *x = g->ranks[r];
        x->prev_logits = 0; /* nothing may name the profiling step's tokens */
        x->has_last_shape = false; /* nor run its forward again: its KV pool is a scratch block */
        x->timed_prev = false;
        x->busy_ms = x->idle_ms = 0;
        x->timed_steps = 0;
    }
    sampler_free(greedy);
    free(tok);
    free(pos);
    free(slots);
    free(qs);
    free(lens);
    free(bt);
    free(li);
    free(smp);
    free(out);
    return rc;
}

/* ---- CUDA graphs ---------------------------------------------------------------------- */

/* Captures the decode forward of `rows` rows (every input from the fixed buffers; a context
 * of up to max_model_len) into *exec. */
static int capture(struct cuda_backend *b, int rows, cudaGraphExec_t *exec, char *err, size_t errlen)
{
    cudaGraph_t graph = NULL;
    const struct cu_shape sh = cu_decode_graph_shape(b, rows);
    const char *where = "";
    int layer = -1;
    cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal);
    if (e) return cu_error(b, false, e, err, errlen, "capturing the decode graph of batch %d", rows);
    int fe = cu_forward(b, &sh, &where, &layer);
    e = cudaStreamEndCapture(b->stream, &graph);
    if (fe) {
        if (graph) cudaGraphDestroy(graph);
        return cu_error(b, false, fe, err, errlen, "capturing the decode graph of batch %d: kernel %s, layer %d", rows,
                        where, layer);
    }
    if (e) return cu_error(b, false, e, err, errlen, "capturing the decode graph of batch %d", rows);
    e = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e) return cu_error(b, false, e, err, errlen, "instantiating the decode graph of batch %d", rows);
    if ((e = cudaGraphUpload(*exec, b->stream))) {
        cudaGraphExecDestroy(*exec);
        return cu_error(b, false, e, err, errlen, "uploading the decode graph of batch %d", rows);
    }
    return 0;
}

/* ---- create --------------------------------------------------------------------------- */

/* Start-up step 1 to 3 of the file comment, and the scratch KV block of step 4, on one
 * rank (its device current). */
static int setup_rank(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    (void)arg;
    const struct model *m = b->m;
    const struct model_config *c = &m->cfg;
    const struct backend_config *cfg = &b->cfg;
    cudaError_t e;
    int rc;

    b->kv = (struct kv_layer *)calloc((size_t)c->n_layers, sizeof *b->kv);
    if (!b->kv) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");

    /* 1. device, stream, events, cuBLAS */
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(b->device)) || (e = cudaGetDeviceProperties(&prop, b->device)) || (e = cudaFree(NULL)))
        return cu_error(NULL, false, e, err, errlen, "device %d", b->device);
    if ((e = cudaMemGetInfo(&b->free0, &b->total))) return cu_error(NULL, false, e, err, errlen, "cudaMemGetInfo");
    snprintf(b->info.name, sizeof b->info.name, "cuda");
    snprintf(b->info.device, sizeof b->info.device, "%.100s, cc %d.%d, %.1f GiB", prop.name, prop.major, prop.minor,
             (double)b->total / GIB);
    if ((e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) ||
        (e = cudaEventCreateWithFlags(&b->ev_done, cudaEventDisableTiming)) ||
        (e = cudaEventCreate(&b->ev_start[0])) || (e = cudaEventCreate(&b->ev_start[1])) ||
        (e = cudaEventCreate(&b->ev_end[0])) || (e = cudaEventCreate(&b->ev_end[1])))
        return cu_error(NULL, false, e, err, errlen, "creating the stream and events");
    cublasHandle_t h = NULL;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return err_set(err, errlen, ERR_IO, "cuda: cannot create a cuBLAS handle");
    b->cublas = h;
    if (cublasSetStream(h, b->stream) != CUBLAS_STATUS_SUCCESS)
        return err_set(err, errlen, ERR_IO, "cuda: cublasSetStream failed");
    LOG_INFO("cuda", "device %d: %s, %d SMs, %.1f GiB free of %.1f GiB", b->device, b->info.device,
             prop.multiProcessorCount, (double)b->free0 / GIB, (double)b->total / GIB);
    /* the kernel settings (docs/cuda-backend.md); an unknown value stops start-up */
    static const char *const on_off[] = { "on", "off" }, *const splits[] = { "wave", "fixed" },
                             *const rows[] = { DECODE_ROWS_DEFAULT, DECODE_ROWS_OTHER, "8", "auto" },
                             *const loads[] = { QUANT_LOADS_DEFAULT, QUANT_LOADS_OTHER, "staged" };
    int pdl, fuse, split, nrows, qload, l2pf, mixed;
    if ((rc = env_pick("TESSERA_CUDA_PDL", on_off, 2, "on or off", &pdl, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_FUSE", on_off, 2, "on or off", &fuse, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_DECODE_SPLIT", splits, 2, "wave or fixed", &split, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_DECODE_ROWS", rows, 4, "tune, 16, 8 or auto", &nrows, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_QUANT_LOADS", loads, 3, "tune, direct or staged", &qload, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_L2_PREFETCH", on_off, 2, "on or off", &l2pf, err, errlen)) ||
        (rc = env_pick("TESSERA_CUDA_MIXED_SPLIT", on_off, 2, "on or off", &mixed, err, errlen)))
        return rc;
    b->pdl = prop.major >= 9 && pdl == 0;  /* programmatic dependent launch (kernels/common.cuh): Hopper+ */
    b->fuse = fuse == 0;                   /* fused kernels (linear.cu, cu_gate_up_fused) */
    b->split_fixed = split == 1;           /* the decode attention's split (forward.cu, cu_decode_split) */
    b->mixed_split = mixed == 0;           /* mixed steps' one-row sequences: the decode attention (forward.cu) */
    /* Q4_K GEMV loads (kernels/quant_matmul.h, cuda_quant_gemv): measured (linear.cu) or fixed */
    b->qmm_tune = !strcmp(loads[qload], "tune");
    b->qmm_direct = strcmp(loads[qload], "staged") != 0;
    /* query heads per decode attention block (kernels/attention_decode.h, head_rows), per
       batch bucket: tune = measured on this GPU once the KV cache exists (attention_plan.cu;
       16 until then); 16, 8, or auto (0: the kernel's choice, 8 for groups of up to 8 heads) */
    const char *rows_name = rows[nrows];
    b->decode_rows_tune = !strcmp(rows_name, "tune");
    memset(b->decode_rows, !strcmp(rows_name, "8") ? 8 : !strcmp(rows_name, "auto") ? 0 : 16, sizeof b->decode_rows);
    /* the next weights into the L2 during a small decode step's norms, RoPE and attention
       (kernels/l2_hint.h): Hopper's bulk prefetch, at most half the L2 per window */
    b->l2_prefetch = prop.major >= 9 && l2pf == 0 && prop.l2CacheSize > 0;
    b->l2_window = (uint64_t)(prop.l2CacheSize > 0 ? prop.l2CacheSize : 0) / 2 & ~(uint64_t)15;
    if (b->l2_prefetch)
        LOG_INFO("cuda", "device %d: L2 prefetch of the next weights in decode steps of up to %d rows, %.1f MiB "
                         "per window", b->device, CU_TUNED_TOKENS, (double)b->l2_window / (1024.0 * 1024.0));
    b->num_sms = prop.multiProcessorCount;

    /* KV dtype: auto = the model's 16-bit type (BF16 unless its matrices are F16) */
    b->info.kv_dtype = !cfg->kv_dtype_auto ? cfg->kv_dtype
                       : c->n_layers > 0 && m->w.layers[0].wq->type == DT_F16 ? KV_F16
                                                                              : KV_BF16;
    b->info.block_size = cfg->block_size;

    /* 2. weights (this rank's share) */
    const double tw = now_s();
    const size_t free_before_w = mem_free();
    if ((rc = cu_weights_load(b, err, errlen))) return rc;
    b->info.weight_bytes = free_before_w - mem_free();
    LOG_INFO("cuda", "device %d: weights %.2f GiB in %.1f s (activations %s)", b->device,
             (double)b->info.weight_bytes / GIB, now_s() - tw, dtype_name(b->w.act));

    /* 3. step buffers */
    b->Tmax = cfg->max_num_batched_tokens;
    b->Lmax = cfg->max_num_seqs < b->Tmax ? cfg->max_num_seqs : b->Tmax;
    const int prof_seqs = (b->Tmax + cfg->max_model_len - 1) / cfg->max_model_len;
    b->Smax = cfg->max_num_seqs > prof_seqs ? cfg->max_num_seqs : prof_seqs;
    b->max_blocks = (cfg->max_model_len + cfg->block_size - 1) / cfg->block_size;
    b->pen_cap = (size_t)b->Lmax * (size_t)(cfg->max_model_len < c->vocab_size ? cfg->max_model_len : c->vocab_size);
    b->staging_bytes = cu_staging_capacity(b);
    b->free_w = mem_free();
    if ((rc = alloc_buffers(b, err, errlen))) return rc;
    const double tl = now_s();
    if ((rc = cu_linear_plan(b, err, errlen))) return rc;
    LOG_INFO("cuda", "device %d: linear kernels chosen in %.2f s", b->device, now_s() - tl);

    /* 4. the profiling step's one-block scratch pool (every block-table entry 0) */
    const size_t layer_block = 2 * (size_t)b->nkv * (size_t)cfg->block_size * (size_t)c->head_dim *
                               kv_dtype_size(b->info.kv_dtype);
    if ((rc = cu_alloc(b, &b->kv_scratch, layer_block, "the profiling step's scratch KV block", err, errlen)))
        return rc;
    if ((e = cudaMemset(b->kv_scratch, 0, layer_block)))
        return cu_error(NULL, false, e, err, errlen, "clearing the scratch KV block");
    set_kv(b, (unsigned char *)b->kv_scratch, 1, 0);
    return 0;
}

/* Bytes of one KV block over all layers on this rank. */
static size_t block_bytes_of(const struct cuda_backend *b)
{
    const struct model_config *c = &b->m->cfg;
    return (size_t)c->n_layers * 2 * (size_t)b->nkv * (size_t)b->cfg.block_size * (size_t)c->head_dim *
           kv_dtype_size(b->info.kv_dtype);
}

/* Steps 4 (after the profiling step), 5 and 6's budget on one rank: the activation peak,
 * the graph reserve, and how many KV blocks fit (fit_blocks), or why not one
 * max_model_len sequence does (fit_msg). */
static int plan_rank(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    const int n_buckets = *(const int *)arg;
    const int largest = n_buckets ? ((const int *)arg)[n_buckets] : 0;
    const struct backend_config *cfg = &b->cfg;
    const size_t layer_block = block_bytes_of(b) / (size_t)b->m->cfg.n_layers;
    cudaError_t e;
    int rc;
    if ((e = cudaStreamSynchronize(b->stream))) return cu_error(NULL, false, e, err, errlen, "the profiling step");
    b->info.activation_bytes = b->free_w - mem_free() - layer_block;

    /* 5. graph memory: one capture of the largest bucket, times the number of buckets */
    if (largest) {
        cudaGraphExec_t x;
        const size_t f = mem_free();
        if ((rc = capture(b, largest, &x, err, errlen))) return rc;
        const size_t after = mem_free();
        cudaGraphExecDestroy(x);
        b->graph_reserve = (f > after ? f - after : 0) * (size_t)n_buckets;
    }
    cu_free(b, b->kv_scratch);
    b->kv_scratch = NULL;

    /* 6. the KV budget */
    const size_t block_bytes = block_bytes_of(b);
    const double own = (double)(b->free0 - mem_free());
    double budget = cfg->gpu_memory_utilization * (double)b->total - own - (double)b->graph_reserve;
    const double free_now = (double)mem_free() - (double)b->graph_reserve;
    if (budget > free_now) budget = free_now; /* other processes hold memory too */
    const int need = b->max_blocks;
    const double n = budget > 0 ? floor(budget / (double)block_bytes) : 0;
    b->fit_blocks = n > (double)INT32_MAX ? INT32_MAX : (int)n;
    b->fit_msg[0] = 0;
    if (b->fit_blocks < need) {
        const double missing = (double)need * (double)block_bytes - (budget > 0 ? budget : 0);
        snprintf(b->fit_msg, sizeof b->fit_msg,
                 "not enough device memory for the KV cache of one %d-token sequence "
                 "(--max-model-len): it needs %.3f GiB (%s), %.3f GiB are left = %.2f of %.1f GiB "
                 "(--gpu-memory-utilization) - %.3f GiB weights - %.3f GiB activations "
                 "(--max-num-batched-tokens %d, --max-num-seqs %d) - %.3f GiB CUDA graphs; "
                 "%.3f GiB missing. Raise --gpu-memory-utilization, lower --max-model-len, "
                 "--max-num-seqs or --max-num-batched-tokens, or use --kv-cache-dtype fp8%s",
                 cfg->max_model_len, (double)need * (double)block_bytes / GIB, kv_dtype_name(b->info.kv_dtype),
                 budget > 0 ? budget / GIB : 0.0, cfg->gpu_memory_utilization, (double)b->total / GIB,
                 (double)b->info.weight_bytes / GIB, (double)b->info.activation_bytes / GIB, b->Tmax,
                 cfg->max_num_seqs, (double)b->graph_reserve / GIB, missing / GIB,
                 b->world == 1 ? " (or more GPUs: --tensor-parallel-size)" : "");
    }
    return 0;
}

/* Step 6 on one rank: the KV pool of *(int *)arg blocks. */
static int alloc_kv(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    const int nb = *(const int *)arg;
    void *pool;
    int rc = cu_alloc(b, &pool, (size_t)nb * block_bytes_of(b), "the KV cache", err, errlen);
    if (rc) return rc;
    set_kv(b, (unsigned char *)pool, nb, (size_t)nb * (block_bytes_of(b) / (size_t)b->m->cfg.n_layers));
    b->info.num_blocks = nb;
    b->info.kv_bytes = (size_t)nb * block_bytes_of(b);
    return 0;
}

/* Step 7 on one rank: the decode graphs of the buckets in arg ({n, bucket...}), within
 * the time budget. */
static int capture_graphs(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    const int n_buckets = *(const int *)arg;
    const int *buckets = (const int *)arg + 1;
    const double tg = now_s();
    cudaError_t e;
    int rc;
    b->graphs = (struct cu_graph *)calloc((size_t)n_buckets, sizeof *b->graphs);
    if (!b->graphs) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    for (int i = 0; i < n_buckets; i++) {
        if (i && now_s() - tg > GRAPH_CAPTURE_BUDGET_S) {
            LOG_WARN("cuda", "graph capture budget of %.0f s spent: decode batches above %d run eagerly",
                     GRAPH_CAPTURE_BUDGET_S, b->graphs[b->n_graphs - 1].batch);
            break;
        }
        if ((rc = capture(b, buckets[i], &b->graphs[i].exec, err, errlen))) return rc;
        b->graphs[i].batch = buckets[i];
        b->n_graphs++;
    }
    if ((e = cudaStreamSynchronize(b->stream))) return cu_error(NULL, false, e, err, errlen, "uploading the CUDA graphs");
    return 0;
}

/* Destroys this rank's graphs past *(int *)arg (the ranks keep the same buckets). */
static int trim_graphs(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const int keep = *(const int *)arg;
    while (b->n_graphs > keep) cudaGraphExecDestroy(b->graphs[--b->n_graphs].exec);
    return 0;
}

/* Steps 1-7 of the file comment on every rank of g. Returns 0 or an error; the caller
 * destroys g on failure. */
static int build(struct cu_group *g, struct backend_info *info, char *err, size_t errlen)
{
    struct cuda_backend *b0 = g->ranks[0];
    const struct backend_config *cfg = &b0->cfg;
    const double t0 = now_s();
    int rc;

    if ((rc = cu_group_run(g, setup_rank, NULL, err, errlen))) return rc;
    for (int r = 0; r < g->world; r++) g->ranks[r]->h_src = b0->h_staging;

    const double tp = now_s();
    if ((rc = profile_step(g, err, errlen))) return rc;

    int buckets[GRAPH_MAX_BATCH + 1]; /* {n, bucket...} */
    const int n_buckets = cfg->enforce_eager ? 0
                                             : make_buckets(b0->Lmax < GRAPH_MAX_BATCH ? b0->Lmax : GRAPH_MAX_BATCH,
                                                            buckets + 1, GRAPH_MAX_BATCH);
    buckets[0] = n_buckets;
    if ((rc = cu_group_run(g, plan_rank, buckets, err, errlen))) return rc;
    LOG_INFO("cuda", "profiling step of %d tokens in %.2f s: activations %.2f GiB%s", b0->Tmax, now_s() - tp,
             (double)b0->info.activation_bytes / GIB, g->world > 1 ? " per GPU" : "");

    /* the KV cache: the same block count on every rank (each holds its heads' share) */
    int nb = cfg->num_blocks;
    if (nb <= 0) {
        nb = INT32_MAX;
        for (int r = 0; r < g->world; r++) {
            const struct cuda_backend *b = g->ranks[r];
            if (b->fit_msg[0]) {
                if (g->world == 1) return err_set(err, errlen, ERR_NOMEM, "cuda: %s", b->fit_msg);
                return err_set(err, errlen, ERR_NOMEM, "cuda: GPU %d (device %d): %s", r, b->device, b->fit_msg);
            }
            if (b->fit_blocks < nb) nb = b->fit_blocks;
        }
    }
    if ((rc = cu_group_run(g, alloc_kv, &nb, err, errlen))) return rc;

    /* the decode attention's layout per batch bucket, measured over the KV cache */
    if (b0->decode_rows_tune) {
        const double ta = now_s();
        if ((rc = cu_group_run(g, cu_decode_plan, NULL, err, errlen))) return rc;
        LOG_INFO("cuda", "decode attention layouts chosen in %.2f s", now_s() - ta);
    }

    /* 7. the decode graphs */
    if (n_buckets) {
        const double tg = now_s();
        if ((rc = cu_group_run(g, capture_graphs, buckets, err, errlen))) return rc;
        int keep = b0->n_graphs;
        for (int r = 1; r < g->world; r++)
            if (g->ranks[r]->n_graphs < keep) keep = g->ranks[r]->n_graphs;
        if ((rc = cu_group_run(g, trim_graphs, &keep, err, errlen))) return rc;
        LOG_INFO("cuda", "captured %d CUDA graphs (decode batches 1..%d) in %.2f s%s", keep,
                 b0->graphs[keep - 1].batch, now_s() - tg, g->world > 1 ? " on every GPU" : "");
    }

    /* what the engine sees: totals over the ranks */
    *info = b0->info;
    info->graphs = b0->n_graphs > 0;
    for (int r = 1; r < g->world; r++) {
        info->weight_bytes += g->ranks[r]->info.weight_bytes;
        info->kv_bytes += g->ranks[r]->info.kv_bytes;
        if (g->ranks[r]->info.activation_bytes > info->activation_bytes)
            info->activation_bytes = g->ranks[r]->info.activation_bytes;
    }
    if (g->world > 1) {
        char one[sizeof info->device];
        snprintf(one, sizeof one, "%s", info->device);
        snprintf(info->device, sizeof info->device, "%d x %.120s, tensor parallel", g->world, one);
    }
    info->max_concurrency = (int)((int64_t)nb * cfg->block_size / cfg->max_model_len);
    LOG_INFO("cuda", "KV cache (%s): %d blocks of %d tokens = %lld tokens, %.2f GiB%s; maximum concurrency for "
             "%d tokens per request: %.2fx",
             kv_dtype_name(info->kv_dtype), nb, cfg->block_size, (long long)nb * cfg->block_size,
             (double)info->kv_bytes / GIB, g->world > 1 ? " over all GPUs" : "", cfg->max_model_len,
             (double)nb * cfg->block_size / cfg->max_model_len);
    LOG_INFO("cuda", "ready in %.1f s", now_s() - t0);
    return 0;
}

extern "C" int tessera_cuda_backend_create(const struct model *m, const struct backend_config *cfg,
                                           const struct backend_ops **ops, void **impl, struct backend_info *info,
                                           char *err, size_t errlen)
{
    int rc, ndev = 0;
    cudaError_t e;
    *ops = NULL;
    *impl = NULL;
    const int world = cfg->tensor_parallel_size > 0 ? cfg->tensor_parallel_size : 1;
    if ((rc = check_model(&m->cfg, err, errlen)) || (rc = check_config(cfg, err, errlen))) return rc;
    if (world > CU_MAX_RANKS)
        return err_set(err, errlen, ERR_UNSUPPORTED, "cuda: --tensor-parallel-size %d: at most %d GPUs", world,
                       CU_MAX_RANKS);
    if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess)
        return cu_error(NULL, false, e, err, errlen, "no usable GPU (cudaGetDeviceCount)");
    if (cfg->device_index < 0 || cfg->device_index + world > ndev)
        return err_set(err, errlen, ERR_INVALID, "cuda: devices %d..%d requested (--tensor-parallel-size %d), %d visible "
                       "(CUDA_VISIBLE_DEVICES)", cfg->device_index, cfg->device_index + world - 1, world, ndev);
    if ((rc = check_split(m, world, err, errlen))) return rc;
    struct cu_group *g = (struct cu_group *)calloc(1, sizeof *g);
    if (!g) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    g->world = world;
    for (int r = 0; r < world; r++) {
        struct cuda_backend *b = (struct cuda_backend *)calloc(1, sizeof *b);
        if (!b) {
            cu_destroy(g);
            return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
        }
        g->ranks[r] = b;
        b->m = m;
        b->cfg = *cfg;
        b->device = cfg->device_index + r;
        b->rank = r;
        b->world = world;
        b->nh = m->cfg.n_heads / world;
        if (m->cfg.n_kv_heads >= world) {
            b->nkv = m->cfg.n_kv_heads / world;
            b->kv0 = r * b->nkv;
        } else { /* replicated: the KV head of this rank's query heads' group */
            b->nkv = 1;
            b->kv0 = r * m->cfg.n_kv_heads / world;
        }
        b->ffn = m->cfg.ffn_dim / world;
    }
    if ((rc = cu_group_start(g, err, errlen)) || (rc = build(g, info, err, errlen))) {
        cu_destroy(g);
        return rc;
    }
    *ops = &cu_ops;
    *impl = g;
    return 0;
}

/* GPU time of the timed steps since create (or the last reset), on the first GPU: busy =
 * from the first operation of a step to its last, idle = from the end of one step to the
 * start of the next (the host's share of the step loop). For benchmarks; the backend's
 * thread only. */
extern "C" void tessera_cuda_backend_timing(void *impl, int reset, double *busy_ms, double *idle_ms, long *steps)
{
    struct cuda_backend *b = ((struct cu_group *)impl)->ranks[0];
    if (busy_ms) *busy_ms = b->busy_ms;
    if (idle_ms) *idle_ms = b->idle_ms;
    if (steps) *steps = b->timed_steps;
    if (reset) {
        b->busy_ms = b->idle_ms = 0;
        b->timed_steps = 0;
        b->timed_prev = false;
    }
}
