/* attention_plan.cu — the decode attention's layout per decode batch bucket: how many
 * query heads one thread block holds (kernels/attention_decode.h, head_rows), and the
 * start-up measurement that decides it.
 *
 * The decode attention has two layouts that read the same K/V bytes once: 16 heads per
 * block (16x16x16 fragments, the heads as M) and 8 (32x8x16, the heads as N). For groups
 * of up to 8 query heads per kv head (every model in config/models/; Qwen2.5-7B: 7) the
 * 8-head layout issues half the MMAs and loads fewer fragment bytes from shared memory, so
 * it should win where the kernel is bound by its on-chip work (FP8 caches, large batches)
 * and tie where it waits on memory. Which one wins at a batch size depends on the GPU, the
 * KV dtype and the batch, so each rank measures it once, as linear.cu does for the
 * linears: after the KV cache exists and before the decode graphs are captured, for every
 * decode batch bucket (1, 2, 4, then multiples of 8, up to max_num_seqs and at most
 * CU_DECODE_MAX_ROWS), that many sequences of PLAN_CONTEXT positions (max_model_len when
 * shorter) on distinct KV blocks, split as a decode step of the bucket is, each layout
 * a warm-up and 8 calls back to back cycling through the layers' pools (so the K/V stream from HBM
 * as in a step, not from the L2), two rounds, the best round kept. The winner is stored per
 * bucket (b->decode_rows) and used by every decode step and captured graph of the bucket,
 * and by a mixed step's leading one-row sequences (forward.cu).
 *
 * TESSERA_CUDA_DECODE_ROWS (read in create.cu): tune (the default on a GPU), 16 (the
 * default under the CUDA-on-CPU emulator, where timings mean nothing), 8, or auto (the
 * kernel's choice: 8 for groups of up to 8 heads, else 16).
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "util/err.h"
#include "util/log.h"
}

#include "kernels/attention_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The context the layouts are timed at: a serving step's typical length, not the longest. */
#define PLAN_CONTEXT 2048

/* The two layouts measured, in the order a tie keeps (the first). */
static const int candidates[2] = { 16, 8 };

/* What the timing calls read: n sequences of ctx positions. */
struct plan_input {
    int n, ctx;
};

/* One timed decode attention call (cu_time_calls): a bucket of `rows` rows over the n
 * sequences in the step buffers, in blocks of head_rows heads, call i on layer i's pool
 * (modulo the layers); the output goes to d.act. */
struct layout_call {
    int rows, head_rows;
    const struct plan_input *in;
};

static int layout_call(struct cuda_backend *b, int i, void *ctx)
{
    const struct layout_call *c = (const struct layout_call *)ctx;
    const struct model_config *m = &b->m->cfg;
    int part, maxp;
    cu_decode_split_for(b, c->rows, c->head_rows, &part, &maxp);
    return cuda_attention_decode(b->d.act, b->w.act, b->d.q, (int64_t)b->nh * m->head_dim, &b->kv[i % m->n_layers],
                                 b->d.seq_lens, b->d.block_tables, b->max_blocks, c->in->n, b->nh,
                                 1.0f / sqrtf((float)m->head_dim), b->cfg.max_model_len, part, maxp, c->head_rows,
                                 b->d.att_ws, b->d.att_ws_bytes, NULL, b->pdl, b->stream);
}

/* The step buffers' sequence lengths and block tables for the timing: n sequences of ctx
 * positions, each on its own blocks as far as the pool holds them (then wrapping around). */
static int fill_inputs(struct cuda_backend *b, const struct plan_input *in, char *err, size_t errlen)
{
    const int per_seq = (in->ctx + b->cfg.block_size - 1) / b->cfg.block_size, nb = b->kv[0].num_blocks;
    int32_t *lens = (int32_t *)malloc(sizeof *lens * (size_t)in->n);
    int32_t *tables = (int32_t *)calloc((size_t)in->n * (size_t)b->max_blocks, sizeof *tables);
    if (!lens || !tables) {
        free(lens);
        free(tables);
        return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    }
    for (int s = 0; s < in->n; s++) {
        lens[s] = in->ctx;
        for (int j = 0; j < per_seq; j++)
            tables[(size_t)s * b->max_blocks + j] = (int32_t)(((int64_t)s * per_seq + j) % nb);
    }
    cudaError_t e = cudaMemcpy(b->d.seq_lens, lens, sizeof *lens * (size_t)in->n, cudaMemcpyHostToDevice);
    if (!e)
        e = cudaMemcpy(b->d.block_tables, tables, sizeof *tables * (size_t)in->n * (size_t)b->max_blocks,
                       cudaMemcpyHostToDevice);
    /* the queries: zero (the timing does not depend on them, and zeros are never NaN) */
    if (!e) e = cudaMemset(b->d.q, 0, sizeof(float) * (size_t)in->n * (size_t)b->nh * (size_t)b->m->cfg.head_dim);
    free(lens);
    free(tables);
    return e ? cu_error(b, false, e, err, errlen, "preparing the decode attention's measurement") : 0;
}

/* "batch 1-8: 8, batch 16-256: 16" for the log, from the slots of buckets 1..last. */
static void describe(const struct cuda_backend *b, int last, char *buf, size_t len)
{
    size_t o = 0;
    int start = 1, prev = 1;
    buf[0] = 0;
    for (int v = 1;; v = cu_bucket_ceil(v + 1)) {
        const int rows = b->decode_rows[cu_decode_slot(start)];
        if (v > last || b->decode_rows[cu_decode_slot(v)] != rows) {
            const char *sep = o ? ", " : "";
            if (o < len && prev > start) o += (size_t)snprintf(buf + o, len - o, "%sbatch %d-%d: %d", sep, start, prev, rows);
            else if (o < len) o += (size_t)snprintf(buf + o, len - o, "%sbatch %d: %d", sep, start, rows);
            if (v > last) break;
            start = v;
        }
        prev = v;
    }
}

int cu_decode_plan(struct cuda_backend *b, void *arg, char *err, size_t errlen)
{
    (void)arg;
    if (!b->decode_rows_tune) return 0;
    /* the buckets a decode step can have: up to Lmax rows (max_num_seqs, at most Tmax) */
    const int max_rows = b->Lmax < CU_DECODE_MAX_ROWS ? b->Lmax : CU_DECODE_MAX_ROWS, last = cu_bucket_ceil(max_rows);
    const int ctx = b->cfg.max_model_len < PLAN_CONTEXT ? b->cfg.max_model_len : PLAN_CONTEXT;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e;
    /* the KV cache zeroed first: the times must not depend on what the allocation held
       (FP8 codes of NaN, say); every block is written before a step reads it anyway */
    if ((e = cudaMemset(b->kv[0].data, 0, b->info.kv_bytes)))
        return cu_error(b, false, e, err, errlen, "clearing the KV cache");
    if ((e = cudaEventCreate(&e0)) || (e = cudaEventCreate(&e1))) {
        if (e0) cudaEventDestroy(e0);
        return cu_error(b, false, e, err, errlen, "creating the timing events");
    }
    float lo = 0, hi = 0; /* the range of 16-head time / 8-head time over the buckets */
    int rc = 0;
    for (int v = 1; v <= last && !rc; v = cu_bucket_ceil(v + 1)) {
        const struct plan_input in = { v < max_rows ? v : max_rows, ctx }; /* a bucket's steps: <= max_rows rows */
        if ((rc = fill_inputs(b, &in, err, errlen))) break;
        float best[2] = { -1.0f, -1.0f };
        for (int round = 0; round < 2 && !rc; round++)
            for (int k = 0; k < 2; k++) {
                struct layout_call c = { v, candidates[k], &in };
                const float ms = cu_time_calls(b, 8, layout_call, &c, e0, e1);
                if (ms < 0) {
                    rc = cu_error(b, false, (int)cudaGetLastError(), err, errlen,
                                  "timing the decode attention with %d heads per block", candidates[k]);
                    break;
                }
                if (best[k] < 0 || ms < best[k]) best[k] = ms;
            }
        if (rc) break;
        b->decode_rows[cu_decode_slot(v)] = (int8_t)candidates[best[1] < best[0] ? 1 : 0];
        const float ratio = best[1] > 0 ? best[0] / best[1] : 1.0f;
        if (v == 1 || ratio < lo) lo = ratio;
        if (v == 1 || ratio > hi) hi = ratio;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (rc) return rc;
    /* larger buckets (never a decode step's: at most Lmax rows) keep the last one's layout */
    for (int s = cu_decode_slot(last) + 1; s < CU_DECODE_SLOTS; s++) b->decode_rows[s] = b->decode_rows[cu_decode_slot(last)];
    char buf[512];
    describe(b, last, buf, sizeof buf);
    LOG_INFO("cuda",
             "device %d: decode attention heads per block (TESSERA_CUDA_DECODE_ROWS=tune, %s KV, %d/%d heads, "
             "contexts of %d; 16-head/8-head time %.2f-%.2f): %s",
             b->device, kv_dtype_name(b->info.kv_dtype), b->nh, b->nkv, ctx, (double)lo, (double)hi, buf);
    return 0;
}
