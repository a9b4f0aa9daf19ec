/* forward.cu — the transformer forward on the GPU: src/model/forward.c's computation,
 * chained from the kernels of kernels/ on the backend's stream.
 *
 *   x = embed(token_ids)                                     cuda_embedding (F32 residual)
 *   per layer:
 *     act = rmsnorm(x += delta)                              cuda_rmsnorm_residual (layer 0: no delta;
 *                                                            small decode steps: it prefetches the
 *                                                            QKV weights into the L2, l2_next; for
 *                                                            quantized linears of 1-8 rows it also
 *                                                            writes act quantized, act_qact; so
 *                                                            do SiLU·mul for the down projection
 *                                                            and a decode step's attention for O)
 *     qkv = act @ [Wq|Wk|Wv]                                 fused GEMM (cu_linear_forward: quantized
 *                                                            GEMV; F16/BF16: GEMV, skinny GEMM or
 *                                                            cuBLAS, measured at start-up)
 *     q/k per-head rmsnorm                                   cuda_head_rmsnorm (qwen3)
 *     q = rope(q), kv[slot] = rope(k), v (+ bias: qwen2)     cuda_rope_kv_write (prefetches Wo: the
 *                                                            attention leaves memory idle)
 *     act = attention(q, kv)                                 one-row sequences (decode steps, a mixed
 *                                                            step's leading ones): cuda_attention_decode;
 *                                                            the rest: cuda_attention_prefill
 *     delta = act @ Wo
 *     act = rmsnorm(x += delta)                              (prefetches Wg|Wu)
 *     gu = act @ [Wg|Wu] ; act = silu(g) * u                 cuda_silu_mul_rows (where our GEMV or skinny
 *                                                            GEMM computes gate/up: one kernel, *_silu,
 *                                                            its rows in gu's memory; cu_gate_up_fused)
 *     delta = act @ Wd
 *   logits rows only: xl = x[rows] + delta[rows] (gathered), rmsnorm, @ Wout
 *
 * Tensor parallel (cuda_backend.h): each rank runs this with its share of the heads and of
 * the MLP, and the O and down projections' partial outputs are summed over the ranks
 * (NCCL all-reduce, in place on delta) before the residual add; rank 0 alone computes the
 * logits rows.
 *
 * Every buffer is the backend's fixed one, so the same calls are captured into the decode
 * graphs unchanged. The residual stream stays F32 throughout (forward.c's x); x += delta
 * is the F32 add inside rmsnorm_residual, bit for bit forward.c's.
 */
#include "backend/cuda/cuda_backend.h"

#include <limits.h>
#include <math.h>

#include "kernels/activation.h"
#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kernels/embedding.h"
#include "kernels/norm.h"
#include "kernels/quant_matmul.h"
#include "kernels/rope.h"
#include "kernels/step.h"

void cu_decode_split_for(const struct cuda_backend *b, int rows, int head_rows, int *partition, int *max_partitions)
{
    if (b->split_fixed) {
        *partition = rows <= 8 ? 512 : rows <= 64 ? 1024 : 2048;
        *max_partitions = INT_MAX;
        return;
    }
    const int bucket = cu_bucket_ceil(rows);
    *partition = 64;
    *max_partitions = cuda_attention_decode_max_partitions(bucket, b->nh, b->nkv, head_rows, b->num_sms);
}

void cu_decode_split(const struct cuda_backend *b, int rows, struct cu_shape *sh)
{
    sh->head_rows = b->decode_rows[cu_decode_slot(rows)];
    cu_decode_split_for(b, rows, sh->head_rows, &sh->partition, &sh->max_partitions);
}

struct cu_shape cu_decode_graph_shape(const struct cuda_backend *b, int rows)
{
    struct cu_shape sh = { rows, rows, rows, true, b->cfg.max_model_len, 0, 0, 0, 0, 0 };
    cu_decode_split(b, rows, &sh);
    return sh;
}

/* The L2 hint for linear L (kernels/l2_hint.h): the first b->l2_window bytes of its
 * weights (whole 16-byte units), in decode steps of up to CU_TUNED_TOKENS rows, where the
 * GEMVs stream weights and the norms, RoPE and attention between them leave memory idle;
 * NULL (no prefetch) in every other step or with b->l2_prefetch off. h holds the hint. */
static const struct cuda_l2_hint *l2_next(const struct cuda_backend *b, const struct cu_shape *sh,
                                          const struct cu_linear *L, struct cuda_l2_hint *h)
{
    if (!b->l2_prefetch || !sh->decode || sh->T > CU_TUNED_TOKENS) return NULL;
    const uintptr_t start = ((uintptr_t)L->w + 15) & ~(uintptr_t)15;
    const uintptr_t end = ((uintptr_t)L->w + (uint64_t)L->n_out * dtype_row_bytes(L->type, L->n_in)) & ~(uintptr_t)15;
    if (end <= start) return NULL;
    h->p = (const void *)start;
    h->bytes = end - start < b->l2_window ? end - start : b->l2_window;
    return h;
}

/* Where the kernel before linears L[0..n) (a norm, or SiLU·mul before the down projection)
 * writes its output quantized for them as well (the kernels' qact: kernels/norm.h,
 * kernels/activation.h), so their GEMVs read it instead of each quantizing that output
 * first: with b->fuse, for rows the quantized GEMV takes (1..QMM_GEMV_MAX_TOKENS), when all
 * n are quantized (their input is then F32); else NULL. */
static void *act_qact(const struct cuda_backend *b, const struct cu_linear *L, int n, int rows)
{
    if (!b->fuse || !b->d.qact || rows < 1 || rows > QMM_GEMV_MAX_TOKENS || b->w.act != DT_F32 ||
        L[0].n_in % 32 != 0)
        return NULL;
    for (int i = 0; i < n; i++)
        if (!cu_linear_quantized(&L[i])) return NULL;
    return b->d.qact;
}

/* tessera_cuda_profile_forward's event after one kernel (profile.cu): the events past
 * prof_cap are not recorded. */
static int prof_mark(struct cuda_backend *b, const char *name)
{
    if (b->prof_n >= b->prof_cap) return 0;
    b->prof_name[b->prof_n] = name;
    return (int)cudaEventRecord(b->prof_ev[b->prof_n++], b->stream);
}

int cu_forward(struct cuda_backend *b, const struct cu_shape *sh, const char **where, int *layer)
{
    const struct model_config *c = &b->m->cfg;
    struct cu_bufs *d = &b->d;
    const enum dtype adt = b->w.act;
    /* this rank's heads and MLP width (all of them on one GPU) */
    const int T = sh->T, dim = c->dim, hd = c->head_dim, nh = b->nh, nkv = b->nkv;
    const int64_t qd = (int64_t)nh * hd, qkv_dim = (int64_t)(nh + 2 * nkv) * hd, ffn = b->ffn;
    const float eps = c->rms_eps, scale = 1.0f / sqrtf((float)hd);
    cudaStream_t st = b->stream;
    const int pdl = b->pdl; /* the kernels below may start while the one before them finishes */
    struct cuda_l2_hint h;  /* the norms and RoPE prefetch the next linear's weights (l2_next) */
    int e;
    /* each kernel: its name for errors (and, while profiling, an event after it) */
#define STEP(name, call)                                                                       \
    do {                                                                                       \
        *where = (name);                                                                       \
        if ((e = (call)) != 0) return e;                                                       \
        if (b->prof_ev && (e = prof_mark(b, name)) != 0) return e;                             \
    } while (0)

    *layer = -1;
    STEP("embedding", cuda_embedding(b->w.embd_type, b->w.embd, c->vocab_size, dim, d->token_ids, T, d->x, st));
    for (int l = 0; l < c->n_layers; l++) {
        const struct cu_layer *cl = &b->w.layers[l];
        *layer = l;
        void *xq = act_qact(b, cl->qkv, cl->n_qkv, T); /* the norm's output quantized, or NULL */
        STEP("rmsnorm_residual (attention)",
             cuda_rmsnorm_residual(d->act, adt, d->x, l ? d->delta : NULL, cl->attn_norm, T, dim, eps,
                                   l2_next(b, sh, &cl->qkv[0], &h), xq, pdl, st));
        for (int i = 0; i < cl->n_qkv; i++)
            STEP("QKV projection", cu_linear_forward(b, &cl->qkv[i], d->act, xq, d->qkv, qkv_dim, T));
        if (cl->q_norm)
            STEP("head_rmsnorm",
                 cuda_head_rmsnorm(d->qkv, qkv_dim, cl->q_norm, cl->k_norm, T, nh, nkv, hd, eps, pdl, st));
        STEP("rope_kv_write", cuda_rope_kv_write(d->q, &b->kv[l], d->qkv, qkv_dim, cl->qkv_bias, d->positions, d->slots,
                                                 b->w.inv_freq, 1.0f, c->rope_layout, T, nh,
                                                 l2_next(b, sh, &cl->o, &h), pdl, st));
        /* one-row sequences (a decode step's, a mixed step's leading ones: rows 0 .. nd-1)
           through the decode kernel, the rest through the prefill kernel; a decode step's
           attention also writes its output quantized for a quantized O projection */
        const int nd = sh->decode ? sh->S : sh->lead;
        xq = sh->decode ? act_qact(b, &cl->o, 1, T) : NULL;
        if (nd > 0)
            STEP(sh->head_rows == 8    ? "attention_decode (8 heads per block)"
                 : sh->head_rows == 16 ? "attention_decode (16 heads per block)"
                                       : "attention_decode (auto heads per block)",
                 cuda_attention_decode(d->act, adt, d->q, qd, &b->kv[l], d->seq_lens, d->block_tables, b->max_blocks,
                                       nd, nh, scale, sh->decode ? sh->max_seq_len : sh->lead_max_len,
                                       sh->partition, sh->max_partitions, sh->head_rows, d->att_ws,
                                       d->att_ws_bytes, xq, pdl, st));
        if (nd < sh->S)
            STEP("attention_prefill",
                 cuda_attention_prefill(d->act, adt, d->q, qd, &b->kv[l], d->query_start + nd, d->seq_lens + nd,
                                        d->block_tables + (int64_t)nd * b->max_blocks, b->max_blocks, sh->S - nd,
                                        T - nd, nh, scale, st));
        STEP("attention output projection", cu_linear_forward(b, &cl->o, d->act, xq, d->delta, dim, T));
        STEP("all-reduce (attention)", cu_all_reduce(b, d->delta, (size_t)T * dim));
        xq = act_qact(b, cl->gate_up, cl->n_gate_up, T);
        STEP("rmsnorm_residual (MLP)",
             cuda_rmsnorm_residual(d->act, adt, d->x, d->delta, cl->ffn_norm, T, dim, eps,
                                   l2_next(b, sh, &cl->gate_up[0], &h), xq, pdl, st));
        void *mlp = d->act, *mlp_q = NULL; /* the SiLU·mul rows the down projection reads (quantized) */
        if (cu_gate_up_fused(b, cl, d->act, T)) {
            mlp = d->gu; /* not d->act, the kernel's input; gu holds [T][ffn] of any act dtype */
            STEP("gate/up projection + silu_mul", cu_gate_up_silu(b, cl, d->act, mlp, T));
        } else {
            for (int i = 0; i < cl->n_gate_up; i++)
                STEP("gate/up projection", cu_linear_forward(b, &cl->gate_up[i], d->act, xq, d->gu, 2 * ffn, T));
            mlp_q = act_qact(b, &cl->down, 1, T); /* written once the gate/up GEMVs have read xq */
            STEP("silu_mul",
                 cuda_silu_mul_rows(d->act, adt, d->gu, d->gu + ffn, 2 * ffn, T, (int)ffn, mlp_q, pdl, st));
        }
        STEP("down projection", cu_linear_forward(b, &cl->down, mlp, mlp_q, d->delta, dim, T));
        STEP("all-reduce (MLP)", cu_all_reduce(b, d->delta, (size_t)T * dim));
    }
    *layer = -1;
    if (sh->L == 0 || b->rank != 0) return 0; /* rank 0 alone computes the logits */
    /* the last layer's x += delta and the final norm, on the logits rows only */
    STEP("gather logits rows", cuda_gather_rows(d->xl, d->x, dim, d->logits_idx, sh->L, st));
    STEP("gather logits rows", cuda_gather_rows(d->dl, d->delta, dim, d->logits_idx, sh->L, st));
    void *xq = act_qact(b, &b->w.output, 1, sh->L);
    STEP("final rmsnorm",
         cuda_rmsnorm_residual(d->xln, adt, d->xl, d->dl, b->w.output_norm, sh->L, dim, eps,
                               l2_next(b, sh, &b->w.output, &h), xq, pdl, st));
    STEP("LM head", cu_linear_forward(b, &b->w.output, d->xln, xq, d->logits, c->vocab_size, sh->L));
#undef STEP
    return 0;
}
