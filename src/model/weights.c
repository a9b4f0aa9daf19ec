/* weights.c — binds tensor names (GGUF or HF) to struct model_weights, checking shapes.
 *
 * Both sources go through one table of (role, GGUF name, HF name, shape); only the
 * lookup differs. Every matrix must be 2-D with ne = [n_in, n_out] exactly and a stored
 * type the matmul accepts; every vector must have exactly the expected length.
 */
#include "model/weights.h"

#include "backend/cpu/quant.h"
#include "loader/gguf.h"
#include "loader/safetensors.h"
#include "model/dummy.h"
#include "util/err.h"
#include "util/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct source {
    const struct gguf_file *g; /* exactly one of g, d, dm */
    const struct hf_dir *d;
    const struct dummy_weights *dm; /* --load-format dummy: HF names */
    const char *file;          /* for messages */
};

static const struct tensor *src_find(const struct source *s, const char *name)
{
    return s->g ? gguf_find_tensor(s->g, name) : s->dm ? dummy_weights_find(s->dm, name) : hf_find_tensor(s->d, name);
}

static void fmt_shape(char *buf, size_t n, const struct tensor *t)
{
    int off = snprintf(buf, n, "[");
    for (int i = 0; i < t->n_dims && off < (int)n; i++)
        off += snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)t->ne[i]);
    if (off < (int)n) snprintf(buf + off, n - off, "]");
}

/* Looks up a matrix expected as ne = [n_in, n_out]. optional: NULL without error. */
static int get_matrix(const struct source *s, const char *name, int64_t n_out, int64_t n_in,
                      int optional, const struct tensor **out, size_t *bytes, char *err, size_t errlen)
{
    const struct tensor *t = src_find(s, name);
    *out = NULL;
    if (!t) {
        if (optional) return 0;
        return err_set(err, errlen, ERR_FORMAT, "%s: missing tensor '%s'", s->file, name);
    }
    if (t->n_dims != 2 || t->ne[0] != n_in || t->ne[1] != n_out) {
        char got[96];
        fmt_shape(got, sizeof got, t);
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]",
                       s->file, name, got, (long long)n_in, (long long)n_out);
    }
    if (!dtype_is_supported(t->type) || dtype_row_bytes(t->type, n_in) == 0)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported type %s for %lld columns",
                       s->file, name, dtype_name(t->type), (long long)n_in);
    if (t->nbytes < dtype_row_bytes(t->type, n_in) * (size_t)n_out)
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%s' data is truncated", s->file, name);
    *out = t;
    *bytes += t->nbytes;
    return 0;
}

/* Looks up a 1-D tensor of n elements and converts it to an owned F32 array. */
static int get_vector(const struct source *s, const char *name, int64_t n, int optional,
                      float **out, char *err, size_t errlen)
{
    const struct tensor *t = src_find(s, name);
    *out = NULL;
    if (!t) {
        if (optional) return 0;
        return err_set(err, errlen, ERR_FORMAT, "%s: missing tensor '%s'", s->file, name);
    }
    if (t->n_dims != 1 || t->ne[0] != n) {
        char got[96];
        fmt_shape(got, sizeof got, t);
        return err_set(err, errlen, ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld]",
                       s->file, name, got, (long long)n);
    }
    if (dtype_row_bytes(t->type, n) == 0 || t->nbytes < dtype_row_bytes(t->type, n))
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: tensor '%s' has unsupported type %s",
                       s->file, name, dtype_name(t->type));
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory for '%s'", s->file, name);
    const uint8_t *p = t->data;
    switch (t->type) {
    case DT_F32: memcpy(v, p, sizeof(float) * (size_t)n); break;
    case DT_F16:
    case DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v[i] = t->type == DT_F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
        }
        break;
    default: quant_dequant_row(t->type, p, v, n); break;
    }
    *out = v;
    return 0;
}

/* Names of one role in both conventions; %d is the layer. */
struct wname { const char *gguf, *hf; };

static const char *pick(const struct source *s, struct wname n, int layer, char *buf, size_t len)
{
    snprintf(buf, len, s->g ? n.gguf : n.hf, layer);
    return buf;
}

static int bind(const struct source *s, const struct model_config *c, struct model_weights *w,
                char *err, size_t errlen)
{
    static const struct wname
        EMB = { "token_embd.weight", "model.embed_tokens.weight" },
        ONORM = { "output_norm.weight", "model.norm.weight" },
        OUT = { "output.weight", "lm_head.weight" },
        ANORM = { "blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight" },
        WQ = { "blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight" },
        WK = { "blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight" },
        WV = { "blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight" },
        BQ = { "blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias" },
        BK = { "blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias" },
        BV = { "blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias" },
        QN = { "blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight" },
        KN = { "blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight" },
        WO = { "blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight" },
        FNORM = { "blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight" },
        WG = { "blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight" },
        WU = { "blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight" },
        WD = { "blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight" };
    char nb[160];
    int rc;
    int64_t dim = c->dim, q_dim = (int64_t)c->n_heads * c->head_dim,
            kv_dim = (int64_t)c->n_kv_heads * c->head_dim, ffn = c->ffn_dim;
    size_t *bytes = &w->matrix_bytes;

    memset(w, 0, sizeof *w);
    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", s->file);
    w->n_layers = c->n_layers;

    if ((rc = get_matrix(s, pick(s, EMB, 0, nb, sizeof nb), c->vocab_size, dim, 0, &w->token_embd,
                         bytes, err, errlen)) ||
        (rc = get_vector(s, pick(s, ONORM, 0, nb, sizeof nb), dim, 0, &w->output_norm, err, errlen)))
        return rc;
    if (c->tied_embeddings) {
        w->output = w->token_embd;
    } else if ((rc = get_matrix(s, pick(s, OUT, 0, nb, sizeof nb), c->vocab_size, dim, 0, &w->output,
                                bytes, err, errlen))) {
        return rc;
    }
    if (c->rope_freq_factors &&
        (rc = get_vector(s, "rope_freqs.weight", c->head_dim / 2, 0, &w->rope_freq_factors, err, errlen)))
        return rc;

    for (int l = 0; l < c->n_layers; l++) {
        struct layer_weights *L = &w->layers[l];
        if ((rc = get_vector(s, pick(s, ANORM, l, nb, sizeof nb), dim, 0, &L->attn_norm, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WQ, l, nb, sizeof nb), q_dim, dim, 0, &L->wq, bytes, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WK, l, nb, sizeof nb), kv_dim, dim, 0, &L->wk, bytes, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WV, l, nb, sizeof nb), kv_dim, dim, 0, &L->wv, bytes, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WO, l, nb, sizeof nb), dim, q_dim, 0, &L->wo, bytes, err, errlen)) ||
            (rc = get_vector(s, pick(s, FNORM, l, nb, sizeof nb), dim, 0, &L->ffn_norm, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WG, l, nb, sizeof nb), ffn, dim, 0, &L->w_gate, bytes, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WU, l, nb, sizeof nb), ffn, dim, 0, &L->w_up, bytes, err, errlen)) ||
            (rc = get_matrix(s, pick(s, WD, l, nb, sizeof nb), dim, ffn, 0, &L->w_down, bytes, err, errlen)))
            return rc;
        if (c->qkv_bias &&
            ((rc = get_vector(s, pick(s, BQ, l, nb, sizeof nb), q_dim, 0, &L->bq, err, errlen)) ||
             (rc = get_vector(s, pick(s, BK, l, nb, sizeof nb), kv_dim, 0, &L->bk, err, errlen)) ||
             (rc = get_vector(s, pick(s, BV, l, nb, sizeof nb), kv_dim, 0, &L->bv, err, errlen))))
            return rc;
        if (c->qk_norm &&
            ((rc = get_vector(s, pick(s, QN, l, nb, sizeof nb), c->head_dim, 0, &L->q_norm, err, errlen)) ||
             (rc = get_vector(s, pick(s, KN, l, nb, sizeof nb), c->head_dim, 0, &L->k_norm, err, errlen))))
            return rc;
    }
    return 0;
}

int weights_from_gguf(const struct gguf_file *g, const char *name, const struct model_config *cfg,
                      struct model_weights *w, char *err, size_t errlen)
{
    struct source s = { .g = g, .file = name };
    int rc = bind(&s, cfg, w, err, errlen);
    if (rc) weights_free(w);
    return rc;
}

int weights_from_hf(const struct hf_dir *d, const char *name, const struct model_config *cfg,
                    struct model_weights *w, char *err, size_t errlen)
{
    struct source s = { .d = d, .file = name };
    int rc = bind(&s, cfg, w, err, errlen);
    if (rc) weights_free(w);
    return rc;
}

int weights_from_dummy(const struct dummy_weights *dm, const char *name, const struct model_config *cfg,
                       struct model_weights *w, char *err, size_t errlen)
{
    struct source s = { .dm = dm, .file = name };
    int rc = bind(&s, cfg, w, err, errlen);
    if (rc) weights_free(w);
    return rc;
}

int weights_add_map(struct model_weights *w, const struct mapped_file *map)
{
    const struct mapped_file **v = realloc(w->maps, sizeof *v * (size_t)(w->n_maps + 1));
    if (!v) return ERR_NOMEM;
    v[w->n_maps++] = map;
    w->maps = v;
    return 0;
}

int weights_n_slots(const struct model_weights *w) { return WEIGHTS_MATS_PER_LAYER * w->n_layers + 2; }

const struct tensor **weights_slot(struct model_weights *w, int i)
{
    const int n = WEIGHTS_MATS_PER_LAYER * w->n_layers;
    if (i >= n) return i == n ? &w->output : &w->token_embd;
    struct layer_weights *L = &w->layers[i / WEIGHTS_MATS_PER_LAYER];
    const struct tensor **s[WEIGHTS_MATS_PER_LAYER] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
    return s[i % WEIGHTS_MATS_PER_LAYER];
}

void weights_free(struct model_weights *w)
{
    if (w->layers) {
        for (int l = 0; l < w->n_layers; l++) {
            struct layer_weights *L = &w->layers[l];
            free(L->attn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->q_norm);
            free(L->k_norm);
            free(L->ffn_norm);
        }
        free(w->layers);
    }
    free(w->output_norm);
    free(w->rope_freq_factors);
    free(w->maps);
    memset(w, 0, sizeof *w);
}
