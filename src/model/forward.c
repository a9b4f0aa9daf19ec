/* forward.c — the transformer forward, written once for llama / qwen2 / qwen3.
 *
 *   x = embed(token_ids)                                   [T, dim]
 *   per layer:
 *     xb = rmsnorm(x) ; q,k,v = xb @ Wq,Wk,Wv (+ bias)      qwen2: bias
 *     q,k = per-head rmsnorm(q,k)                          qwen3 only, before RoPE
 *     q,k = rope(q,k, positions)                           NORMAL or NEOX layout
 *     kv[slot_mapping] = k,v ; att = paged_attention(q, kv, block_tables)
 *     x += att @ Wo
 *     xb = rmsnorm(x) ; x += (silu(xb @ Wg) * (xb @ Wu)) @ Wd
 *   logits = rmsnorm(x[logits_indices]) @ Wout
 *
 * Matmuls run on the thread pool inside cpu_matmul; attention is split over
 * (token, head); the row-wise ops are split over rows when the step has enough of them.
 */
#include "model/forward.h"

#include "backend/cpu/ops.h"
#include "backend/cpu/quant.h"
#include "util/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this many rows the row-wise ops run on the caller: a pool dispatch costs more. */
#define ROWS_PARALLEL_MIN 8

int forward_create(struct forward_state **out, const struct model_config *cfg,
                   const struct model_weights *w, const struct forward_opts *opts, char *err,
                   size_t errlen)
{
    *out = NULL;
    if (opts->max_tokens <= 0)
        return err_set(err, errlen, ERR_INVALID, "forward: max_tokens must be > 0");
    struct forward_state *fs = calloc(1, sizeof *fs);
    if (!fs) return err_set(err, errlen, ERR_NOMEM, "forward: out of memory");
    fs->cfg = cfg;
    fs->max_tokens = opts->max_tokens;
    fs->max_logits = opts->max_logits > 0 ? opts->max_logits : opts->max_tokens;
    fs->max_ctx = opts->max_ctx > 0 ? opts->max_ctx : cfg->max_seq_len;
    if (opts->tp) {
        fs->tp = opts->tp;
    } else {
        fs->tp = tp_create(opts->n_threads);
        fs->own_tp = 1;
        if (!fs->tp) {
            forward_free(fs);
            return err_set(err, errlen, ERR_NOMEM, "forward: cannot create the thread pool");
        }
    }
    int rc = packed_weights_create(&fs->packed, w, fs->tp, err, errlen);
    if (rc) {
        forward_free(fs);
        return rc;
    }
    fs->w = &fs->packed->w;
    size_t T = (size_t)fs->max_tokens, L = (size_t)fs->max_logits;
    size_t dim = (size_t)cfg->dim, qd = (size_t)cfg->n_heads * cfg->head_dim,
           kvd = (size_t)cfg->n_kv_heads * cfg->head_dim, ffn = (size_t)cfg->ffn_dim;
    fs->inv_freq = malloc(sizeof(float) * (size_t)(cfg->head_dim / 2));
    fs->rope_cs = malloc(sizeof(float) * T * (size_t)(cfg->head_dim / 2));
    fs->rope_sn = malloc(sizeof(float) * T * (size_t)(cfg->head_dim / 2));
    fs->x = malloc(sizeof(float) * T * dim);
    fs->xb = malloc(sizeof(float) * T * dim);
    fs->q = malloc(sizeof(float) * T * qd);
    fs->k = malloc(sizeof(float) * T * kvd);
    fs->v = malloc(sizeof(float) * T * kvd);
    fs->att = malloc(sizeof(float) * T * qd);
    fs->hb = malloc(sizeof(float) * T * ffn);
    fs->hb2 = malloc(sizeof(float) * T * ffn);
    fs->xl = malloc(sizeof(float) * L * dim);
    fs->logits = malloc(sizeof(float) * L * (size_t)cfg->vocab_size);
    fs->att_scratch = malloc(sizeof(float) * cpu_paged_attention_scratch_floats(tp_size(fs->tp), fs->max_ctx));

    /* Matmul scratch: the largest need over every matrix at its row count. */
    size_t mm = cpu_matmul_scratch_size(w->output->type, cfg->dim, fs->max_logits);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct layer_weights *lw = &w->layers[l];
        const struct tensor *ms[] = { lw->wq, lw->wk, lw->wv, lw->wo, lw->w_gate, lw->w_up, lw->w_down };
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            size_t s = cpu_matmul_scratch_size(ms[i]->type, ms[i]->ne[0], fs->max_tokens);
            if (s > mm) mm = s;
        }
    }
    fs->mm_scratch = malloc(mm ? mm : 1);
    if (!fs->inv_freq || !fs->rope_cs || !fs->rope_sn || !fs->x || !fs->xb || !fs->q || !fs->k || !fs->v || !fs->att || !fs->hb ||
        !fs->hb2 || !fs->xl || !fs->logits || !fs->att_scratch || !fs->mm_scratch) {
        forward_free(fs);
        return err_set(err, errlen, ERR_NOMEM, "forward: cannot allocate buffers for %d tokens",
                       opts->max_tokens);
    }
    rope_inv_freq(fs->inv_freq, cfg->head_dim, &cfg->rope, w->rope_freq_factors);
    *out = fs;
    return 0;
}

void forward_free(struct forward_state *fs)
{
    if (!fs) return;
    if (fs->own_tp) tp_free(fs->tp);
    packed_weights_free(fs->packed);
    free(fs->inv_freq);
    free(fs->rope_cs);
    free(fs->rope_sn);
    free(fs->x);
    free(fs->xb);
    free(fs->q);
    free(fs->k);
    free(fs->v);
    free(fs->att);
    free(fs->hb);
    free(fs->hb2);
    free(fs->xl);
    free(fs->logits);
    free(fs->mm_scratch);
    free(fs->att_scratch);
    free(fs);
}

/* ---- row-parallel helpers ------------------------------------------------------------- */

enum rows_op { ROWS_RMSNORM, ROWS_SILU_MUL, ROWS_ADD, ROWS_ROPE_ANGLES, ROWS_ROPE, ROWS_KV_WRITE };

struct rows_job {
    enum rows_op op;
    int rows;          /* rows (tokens for ROPE) */
    int n;             /* elements per row (heads for ROPE) */
    float *out;        /* ROPE: x in place */
    const float *a, *b;
    const float *w;    /* rmsnorm weight / rope inv_freq */
    float *cs, *sn;    /* RoPE cos / sin per row (ROPE reads, ROPE_ANGLES writes) */
    const struct kv_layer *kv; /* KV_WRITE: rows a (K) and b (V), n floats each, to their slots */
    const int64_t *slots;
    float eps;
    const int32_t *positions;
    int head_dim;
    enum rope_layout layout;
};

static void rows_range(const struct rows_job *j, int r0, int r1)
{
    int64_t n = j->n;
    switch (j->op) {
    case ROWS_RMSNORM: cpu_rmsnorm(j->out + r0 * n, j->a + r0 * n, j->w, r1 - r0, j->n, j->eps); break;
    case ROWS_SILU_MUL: cpu_silu_mul(j->out + r0 * n, j->a + r0 * n, j->b + r0 * n, (r1 - r0) * n); break;
    case ROWS_ADD: cpu_add(j->out + r0 * n, j->a + r0 * n, (r1 - r0) * n); break;
    case ROWS_KV_WRITE: cpu_kv_write(j->kv, j->a + r0 * n, j->b + r0 * n, j->slots + r0, r1 - r0); break;
    case ROWS_ROPE_ANGLES: {
        int64_t half = j->head_dim / 2;
        cpu_rope_angles(j->cs + r0 * half, j->sn + r0 * half, j->positions + r0, r1 - r0, j->head_dim, j->w);
        break;
    }
    case ROWS_ROPE: {
        int64_t half = j->head_dim / 2;
        cpu_rope_rotate(j->out + r0 * n * j->head_dim, j->cs + r0 * half, j->sn + r0 * half, r1 - r0, j->n,
                        j->head_dim, j->layout);
        break;
    }
    }
}

static void rows_worker(void *arg, int ith, int nth)
{
    const struct rows_job *j = arg;
    long b, e;
    tp_split(j->rows, ith, nth, &b, &e);
    if (b < e) rows_range(j, (int)b, (int)e);
}

static void rows_run(struct forward_state *fs, struct rows_job *j)
{
    if (j->rows >= ROWS_PARALLEL_MIN && tp_size(fs->tp) > 1) tp_run(fs->tp, rows_worker, j);
    else rows_range(j, 0, j->rows);
}

static void rmsnorm_rows(struct forward_state *fs, float *out, const float *x, const float *w,
                         int rows, int n)
{
    struct rows_job j = { .op = ROWS_RMSNORM, .rows = rows, .n = n, .out = out, .a = x, .w = w,
                          .eps = fs->cfg->rms_eps };
    rows_run(fs, &j);
}

static void add_bias(float *y, const float *bias, int rows, int n)
{
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) y[(int64_t)r * n + i] += bias[i];
}

/* ---- batch validation ----------------------------------------------------------------- */

static int check_batch(const struct forward_state *fs, const struct kv_cache *kv, const struct batch *b,
                       char *err, size_t errlen)
{
    const struct model_config *c = fs->cfg;
    if (b->num_tokens <= 0 || b->num_tokens > fs->max_tokens)
        return err_set(err, errlen, ERR_RANGE, "batch: num_tokens %d outside 1..%d", b->num_tokens,
                       fs->max_tokens);
    if (b->num_logits < 0 || b->num_logits > fs->max_logits)
        return err_set(err, errlen, ERR_RANGE, "batch: num_logits %d outside 0..%d", b->num_logits,
                       fs->max_logits);
    if (b->num_seqs <= 0 || b->query_start[0] != 0 || b->query_start[b->num_seqs] != b->num_tokens)
        return err_set(err, errlen, ERR_INVALID, "batch: query_start must run from 0 to num_tokens");
    if (kv->n_layers != c->n_layers || kv->n_kv_heads != c->n_kv_heads || kv->head_dim != c->head_dim)
        return err_set(err, errlen, ERR_INVALID, "batch: kv cache geometry does not match the model");
    int bs = kv->block_size;
    for (int s = 0; s < b->num_seqs; s++) {
        int q0 = b->query_start[s], q1 = b->query_start[s + 1], len = b->seq_lens[s];
        if (q1 < q0 || q1 - q0 > len || len > fs->max_ctx)
            return err_set(err, errlen, ERR_INVALID,
                           "batch: sequence %d has %d new tokens, seq_len %d (max_ctx %d)", s, q1 - q0,
                           len, fs->max_ctx);
        int nblk = (len + bs - 1) / bs;
        if (nblk > b->max_blocks_per_seq)
            return err_set(err, errlen, ERR_INVALID, "batch: sequence %d needs %d blocks, table holds %d",
                           s, nblk, b->max_blocks_per_seq);
        const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks_per_seq;
        for (int i = 0; i < nblk; i++)
            if (bt[i] < 0 || bt[i] >= kv->num_blocks)
                return err_set(err, errlen, ERR_INVALID, "batch: sequence %d block %d = %d out of range",
                               s, i, bt[i]);
        for (int t = q0; t < q1; t++) {
            int pos = len - (q1 - t);
            if (b->positions[t] != pos)
                return err_set(err, errlen, ERR_INVALID, "batch: row %d has position %d, expected %d", t,
                               b->positions[t], pos);
            if (b->token_ids[t] < 0 || b->token_ids[t] >= c->vocab_size)
                return err_set(err, errlen, ERR_INVALID, "batch: token id %d out of range (vocab %d)",
                               b->token_ids[t], c->vocab_size);
            int64_t slot = b->slot_mapping[t];
            if (slot >= 0 && slot != (int64_t)bt[pos / bs] * bs + pos % bs)
                return err_set(err, errlen, ERR_INVALID,
                               "batch: row %d slot %lld does not match its block table", t,
                               (long long)slot);
        }
    }
    for (int i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] < 0 || b->logits_indices[i] >= b->num_tokens)
            return err_set(err, errlen, ERR_INVALID, "batch: logits index %d out of range",
                           b->logits_indices[i]);
    return 0;
}

/* ---- forward -------------------------------------------------------------------------- */

int model_forward(struct forward_state *fs, struct kv_cache *kv, const struct batch *b, char *err,
                  size_t errlen)
{
    int rc = check_batch(fs, kv, b, err, errlen);
    if (rc) return rc;
    const struct model_config *c = fs->cfg;
    const struct model_weights *w = fs->w;
    const int T = b->num_tokens, dim = c->dim, hd = c->head_dim;
    const int qd = c->n_heads * hd, kvd = c->n_kv_heads * hd;
    struct threadpool *tp = fs->tp;

    /* x[t] = token_embd[token_ids[t]] */
    size_t row_bytes = dtype_row_bytes(w->token_embd->type, dim);
    for (int t = 0; t < T; t++)
        quant_dequant_row(w->token_embd->type,
                          (const uint8_t *)w->token_embd->data + (size_t)b->token_ids[t] * row_bytes,
                          fs->x + (int64_t)t * dim, dim);

    /* RoPE angles of this step's positions, once for every layer */
    struct rows_job ra = { .op = ROWS_ROPE_ANGLES, .rows = T, .w = fs->inv_freq, .cs = fs->rope_cs,
                           .sn = fs->rope_sn, .positions = b->positions, .head_dim = hd };
    rows_run(fs, &ra);

    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *lw = &w->layers[l];

        /* attention block */
        rmsnorm_rows(fs, fs->xb, fs->x, lw->attn_norm, T, dim);
        {   /* one quantization of xb, one dispatch for the three */
            const struct tensor *qkv_w[3] = { lw->wq, lw->wk, lw->wv };
            float *qkv_y[3] = { fs->q, fs->k, fs->v };
            cpu_matmul_multi(tp, qkv_w, 3, fs->xb, qkv_y, T, fs->mm_scratch);
        }
        if (c->qkv_bias) {
            add_bias(fs->q, lw->bq, T, qd);
            add_bias(fs->k, lw->bk, T, kvd);
            add_bias(fs->v, lw->bv, T, kvd);
        }
        if (c->qk_norm) { /* one RMSNorm row per head */
            rmsnorm_rows(fs, fs->q, fs->q, lw->q_norm, T * c->n_heads, hd);
            rmsnorm_rows(fs, fs->k, fs->k, lw->k_norm, T * c->n_kv_heads, hd);
        }
        struct rows_job rq = { .op = ROWS_ROPE, .rows = T, .n = c->n_heads, .out = fs->q,
                               .cs = fs->rope_cs, .sn = fs->rope_sn, .head_dim = hd,
                               .layout = c->rope_layout };
        rows_run(fs, &rq);
        struct rows_job rk = rq;
        rk.n = c->n_kv_heads;
        rk.out = fs->k;
        rows_run(fs, &rk);

        struct kv_layer kl = kv_cache_layer(kv, l);
        struct rows_job kvw = { .op = ROWS_KV_WRITE, .rows = T, .n = kvd, .a = fs->k, .b = fs->v, .kv = &kl,
                                .slots = b->slot_mapping }; /* every row its own slot */
        rows_run(fs, &kvw);
        struct paged_attention_args pa = {
            .out = fs->att, .q = fs->q, .kv = &kl, .query_start = b->query_start,
            .seq_lens = b->seq_lens, .block_tables = b->block_tables,
            .max_blocks_per_seq = b->max_blocks_per_seq, .num_seqs = b->num_seqs, .num_tokens = T,
            .n_heads = c->n_heads, .scale = 1.0f / sqrtf((float)hd), .scratch = fs->att_scratch,
            .max_ctx = fs->max_ctx,
        };
        cpu_paged_attention(tp, &pa);
        cpu_matmul(tp, lw->wo, fs->att, fs->xb, T, fs->mm_scratch);
        struct rows_job add = { .op = ROWS_ADD, .rows = T, .n = dim, .out = fs->x, .a = fs->xb };
        rows_run(fs, &add);

        /* MLP block */
        rmsnorm_rows(fs, fs->xb, fs->x, lw->ffn_norm, T, dim);
        {
            const struct tensor *gu_w[2] = { lw->w_gate, lw->w_up };
            float *gu_y[2] = { fs->hb, fs->hb2 };
            cpu_matmul_multi(tp, gu_w, 2, fs->xb, gu_y, T, fs->mm_scratch);
        }
        struct rows_job sm = { .op = ROWS_SILU_MUL, .rows = T, .n = c->ffn_dim, .out = fs->hb,
                               .a = fs->hb, .b = fs->hb2 };
        rows_run(fs, &sm);
        cpu_matmul(tp, lw->w_down, fs->hb, fs->xb, T, fs->mm_scratch);
        rows_run(fs, &add);
    }

    /* output head, only for the rows that need logits */
    if (b->num_logits == 0) return 0;
    for (int i = 0; i < b->num_logits; i++)
        memcpy(fs->xl + (int64_t)i * dim, fs->x + (int64_t)b->logits_indices[i] * dim,
               sizeof(float) * dim);
    rmsnorm_rows(fs, fs->xl, fs->xl, w->output_norm, b->num_logits, dim);
    cpu_matmul(tp, w->output, fs->xl, fs->logits, b->num_logits, fs->mm_scratch);
    return 0;
}
