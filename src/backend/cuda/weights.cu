/* weights.cu — the model's weights into device memory, once, at create.
 *
 * Straight from the model's tensor views (the mmapped GGUF / safetensors bytes, or the
 * dummy loader's host buffers): GGUF quantized matrices keep their block format for
 * cuda_quant_matmul; F16 / BF16 matrices stay as they are for cuBLAS; F32 matrices (some
 * safetensors checkpoints) are converted to BF16 on the way. Q, K and V are fused into
 * one matrix by concatenating their rows when their stored types match (rows are
 * independent, so one GEMM computes all three into the fused QKV rows), and so are gate
 * and up. Norm weights, the QKV bias and Qwen3's q/k norms go up as F32 (the model holds
 * them as F32 already). A tied LM head is the embedding table itself.
 *
 * Tensor parallel (cuda_backend.h): a rank uploads its heads' rows of Q, K, V (and bias; a
 * KV head replicated on several GPUs goes to each), its heads' columns of O, its share of
 * the gate/up rows and of the down columns — strided copies straight from the file,
 * quantized blocks intact (the shares are whole blocks) — and the replicated embedding and
 * norms; the LM head goes to rank 0 only.
 *
 * The activation dtype follows from the linears: if every one (the LM head included) is
 * F16, the norms, attention and SiLU·mul write F16 and cuBLAS reads it directly; likewise
 * BF16; otherwise activations are F32 (what the quantized GEMV quantizes itself) and any
 * dense linear converts its input to its own type first.
 */
#include "backend/cuda/cuda_backend.h"

extern "C" {
#include "util/err.h"
#include "util/half.h"
#include "util/rope.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The type a stored matrix has on the device. */
static enum dtype device_type(enum dtype t) { return t == DT_F32 ? DT_BF16 : t; }

/* A part of a stored matrix: rows [row0, row0 + rows) and columns [k0, k0 + nk) of t (a
 * tensor-parallel rank's share; the whole matrix on one GPU). k0 and nk are multiples of
 * the type's block (checked at create). */
struct part {
    const struct tensor *t;
    int64_t row0, rows, k0, nk;
};

static struct part whole(const struct tensor *t) { return (struct part){ t, 0, t->ne[1], 0, t->ne[0] }; }

/* Host-to-device copy of p into dst (rows of device_type(type) x nk, packed). */
static int upload_part(struct cuda_backend *b, void *dst, const struct part *p, const char *what, char *err,
                       size_t errlen)
{
    const enum dtype st = p->t->type;
    const size_t src_row = dtype_row_bytes(st, p->t->ne[0]);
    const char *src = (const char *)p->t->data + (size_t)p->row0 * src_row + dtype_row_bytes(st, p->k0);
    cudaError_t e;
    if (st != DT_F32) {
        const size_t width = dtype_row_bytes(st, p->nk);
        e = cudaMemcpy2D(dst, width, src, src_row, width, (size_t)p->rows, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return cu_error(b, false, e, err, errlen, "uploading %s", what);
        return 0;
    }
    /* F32 -> BF16 in chunks of rows through a host buffer */
    const int64_t chunk = (1 << 22) / p->nk > 0 ? (1 << 22) / p->nk : 1;
    const int64_t n_rows = p->rows < chunk ? p->rows : chunk;
    uint16_t *tmp = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(n_rows * p->nk));
    if (!tmp) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory converting %s", what);
    for (int64_t r0 = 0; r0 < p->rows; r0 += chunk) {
        const int64_t n = p->rows - r0 < chunk ? p->rows - r0 : chunk;
        for (int64_t j = 0; j < n; j++) {
            const float *f = (const float *)(src + (size_t)(r0 + j) * src_row);
            for (int64_t k = 0; k < p->nk; k++) tmp[j * p->nk + k] = fp32_to_bf16(f[k]);
        }
        e = cudaMemcpy((uint16_t *)dst + r0 * p->nk, tmp, sizeof(uint16_t) * (size_t)(n * p->nk),
                       cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            free(tmp);
            return cu_error(b, false, e, err, errlen, "uploading %s", what);
        }
    }
    free(tmp);
    return 0;
}

/* One device matrix holding the rows of parts[0..n) in order (same stored type, same nk). */
static int upload_linear(struct cuda_backend *b, const struct part *parts, int n, const char *what,
                         struct cu_linear *out, char *err, size_t errlen)
{
    const enum dtype st = parts[0].t->type, dt = device_type(st);
    const int64_t n_in = parts[0].nk;
    const size_t row_bytes = dtype_row_bytes(dt, n_in);
    int64_t n_out = 0;
    for (int i = 0; i < n; i++) n_out += parts[i].rows;
    if (!row_bytes || !dtype_row_bytes(st, n_in))
        return err_set(err, errlen, ERR_UNSUPPORTED, "cuda: %s: type %s with %lld columns is not supported", what,
                       dtype_name(st), (long long)n_in);
    void *d;
    int rc = cu_alloc(b, &d, row_bytes * (size_t)n_out, what, err, errlen);
    if (rc) return rc;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if ((rc = upload_part(b, (char *)d + off, &parts[i], what, err, errlen))) return rc;
        off += row_bytes * (size_t)parts[i].rows;
    }
    *out = (struct cu_linear){ dt, d, n_in, n_out, 0, {} };
    b->w.bytes += row_bytes * (size_t)n_out;
    return 0;
}

/* Either one fused matrix over parts (same stored type) or one matrix per part, each
 * writing its own columns of the shared output rows. */
static int upload_group(struct cuda_backend *b, const struct part *parts, int n, const char *what,
                        struct cu_linear *out, int *n_out, char *err, size_t errlen)
{
    bool same = true;
    for (int i = 1; i < n; i++) same = same && parts[i].t->type == parts[0].t->type;
    if (same) {
        *n_out = 1;
        return upload_linear(b, parts, n, what, &out[0], err, errlen);
    }
    int64_t col = 0;
    for (int i = 0; i < n; i++) {
        int rc = upload_linear(b, &parts[i], 1, what, &out[i], err, errlen);
        if (rc) return rc;
        out[i].col = col;
        col += parts[i].rows;
    }
    *n_out = n;
    return 0;
}

/* A host F32 vector (or the concatenation of up to three) to a new device array. */
static int upload_vec(struct cuda_backend *b, float **out, const float *const *parts, const int64_t *lens, int n,
                      const char *what, char *err, size_t errlen)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    void *d;
    int rc = cu_alloc(b, &d, sizeof(float) * (size_t)total, what, err, errlen);
    if (rc) return rc;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        cudaError_t e = cudaMemcpy((float *)d + off, parts[i], sizeof(float) * (size_t)lens[i], cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return cu_error(b, false, e, err, errlen, "uploading %s", what);
        off += lens[i];
    }
    b->w.bytes += sizeof(float) * (size_t)total;
    *out = (float *)d;
    return 0;
}

static int upload_one(struct cuda_backend *b, float **out, const float *v, int64_t n, const char *what, char *err,
                      size_t errlen)
{
    return upload_vec(b, out, &v, &n, 1, what, err, errlen);
}

int cu_weights_load(struct cuda_backend *b, char *err, size_t errlen)
{
    const struct model_config *c = &b->m->cfg;
    const struct model_weights *mw = &b->m->w;
    struct cu_weights *w = &b->w;
    /* this rank's share: query rows q0.., KV rows k0.., MLP rows f0.. (everything on one GPU) */
    const int64_t dim = c->dim, hd = c->head_dim, qd = (int64_t)b->nh * hd, kvd = (int64_t)b->nkv * hd;
    const int64_t q0 = b->rank * qd, k0 = (int64_t)b->kv0 * hd, ffn = b->ffn, f0 = b->rank * ffn;
    char what[96];
    int rc;

    w->layers = (struct cu_layer *)calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");

    /* embedding (and the tied LM head) */
    const struct part emb = whole(mw->token_embd);
    struct cu_linear e;
    if ((rc = upload_linear(b, &emb, 1, "token embedding", &e, err, errlen))) return rc;
    w->embd_type = e.type;
    w->embd = e.w;
    if (c->tied_embeddings || mw->output == mw->token_embd) {
        w->output = e;
    } else if (b->rank == 0) { /* only rank 0 computes logits */
        const struct part o = whole(mw->output);
        if ((rc = upload_linear(b, &o, 1, "output (LM head)", &w->output, err, errlen))) return rc;
    } else {
        w->output.type = device_type(mw->output->type); /* for the activation dtype below */
    }
    if ((rc = upload_one(b, &w->output_norm, mw->output_norm, dim, "output norm", err, errlen))) return rc;

    float *inv = (float *)malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    if (!inv) return err_set(err, errlen, ERR_NOMEM, "cuda: out of host memory");
    rope_inv_freq(inv, c->head_dim, &c->rope, mw->rope_freq_factors);
    rc = upload_one(b, &w->inv_freq, inv, c->head_dim / 2, "RoPE frequencies", err, errlen);
    free(inv);
    if (rc) return rc;

    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *L = &mw->layers[l];
        struct cu_layer *cl = &w->layers[l];
        const struct part qkv[3] = { { L->wq, q0, qd, 0, dim }, { L->wk, k0, kvd, 0, dim }, { L->wv, k0, kvd, 0, dim } };
        const struct part gu[2] = { { L->w_gate, f0, ffn, 0, dim }, { L->w_up, f0, ffn, 0, dim } };
        const struct part o = { L->wo, 0, dim, q0, qd }, down = { L->w_down, 0, dim, f0, ffn };
        snprintf(what, sizeof what, "layer %d attention norm", l);
        if ((rc = upload_one(b, &cl->attn_norm, L->attn_norm, dim, what, err, errlen))) return rc;
        snprintf(what, sizeof what, "layer %d MLP norm", l);
        if ((rc = upload_one(b, &cl->ffn_norm, L->ffn_norm, dim, what, err, errlen))) return rc;
        if (c->qkv_bias) {
            const float *parts[3] = { L->bq + q0, L->bk + k0, L->bv + k0 };
            const int64_t lens[3] = { qd, kvd, kvd };
            snprintf(what, sizeof what, "layer %d QKV bias", l);
            if ((rc = upload_vec(b, &cl->qkv_bias, parts, lens, 3, what, err, errlen))) return rc;
        }
        if (c->qk_norm) {
            snprintf(what, sizeof what, "layer %d q norm", l);
            if ((rc = upload_one(b, &cl->q_norm, L->q_norm, c->head_dim, what, err, errlen))) return rc;
            snprintf(what, sizeof what, "layer %d k norm", l);
            if ((rc = upload_one(b, &cl->k_norm, L->k_norm, c->head_dim, what, err, errlen))) return rc;
        }
        snprintf(what, sizeof what, "layer %d q/k/v", l);
        if ((rc = upload_group(b, qkv, 3, what, cl->qkv, &cl->n_qkv, err, errlen))) return rc;
        snprintf(what, sizeof what, "layer %d attention output", l);
        if ((rc = upload_linear(b, &o, 1, what, &cl->o, err, errlen))) return rc;
        snprintf(what, sizeof what, "layer %d gate/up", l);
        if ((rc = upload_group(b, gu, 2, what, cl->gate_up, &cl->n_gate_up, err, errlen))) return rc;
        snprintf(what, sizeof what, "layer %d down", l);
        if ((rc = upload_linear(b, &down, 1, what, &cl->down, err, errlen))) return rc;
    }

    /* the activation dtype: one 16-bit type for every linear, or F32 */
    int n_f16 = 0, n_bf16 = 0, n_all = 0;
    auto count = [&](const struct cu_linear *x) {
        n_all++;
        n_f16 += x->type == DT_F16;
        n_bf16 += x->type == DT_BF16;
    };
    count(&w->output);
    for (int l = 0; l < c->n_layers; l++) {
        const struct cu_layer *cl = &w->layers[l];
        for (int i = 0; i < cl->n_qkv; i++) count(&cl->qkv[i]);
        count(&cl->o);
        for (int i = 0; i < cl->n_gate_up; i++) count(&cl->gate_up[i]);
        count(&cl->down);
    }
    w->act = n_f16 == n_all ? DT_F16 : n_bf16 == n_all ? DT_BF16 : DT_F32;
    w->any_dense_cast = w->act == DT_F32 && n_f16 + n_bf16 > 0;
    return 0;
}
