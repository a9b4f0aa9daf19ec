/* weights.h — one tensor view per weight of a model, found by name in a GGUF file or an
 * HF directory and checked against the config.
 *
 * Matrices are views into the mapped files and stay in their stored type (a Q4_1 file
 * stays Q4_1; the matmul dequantizes). Shapes follow util/tensor.h: a matrix used as
 * y = W x has ne[0] = n_in, ne[1] = n_out, written (n_out, n_in) below, i.e. rows of n_in.
 * Small 1-D tensors (norm weights, biases) are converted once to owned F32 arrays.
 */
#ifndef TESSERA_MODEL_WEIGHTS_H
#define TESSERA_MODEL_WEIGHTS_H

#include "model/config.h"
#include "util/tensor.h"

struct gguf_file;
struct hf_dir;
struct mapped_file;

struct layer_weights {
    float *attn_norm;         /* (dim,) */
    const struct tensor *wq;  /* (n_heads * head_dim, dim) */
    const struct tensor *wk;  /* (n_kv_heads * head_dim, dim) */
    const struct tensor *wv;  /* (n_kv_heads * head_dim, dim) */
    float *bq;                /* (n_heads * head_dim,) qkv_bias only, else NULL */
    float *bk;                /* (n_kv_heads * head_dim,) */
    float *bv;                /* (n_kv_heads * head_dim,) */
    float *q_norm;            /* (head_dim,) qk_norm only, else NULL */
    float *k_norm;            /* (head_dim,) */
    const struct tensor *wo;  /* (dim, n_heads * head_dim) */
    float *ffn_norm;          /* (dim,) */
    const struct tensor *w_gate; /* (ffn_dim, dim) */
    const struct tensor *w_up;   /* (ffn_dim, dim) */
    const struct tensor *w_down; /* (dim, ffn_dim) */
};

struct model_weights {
    const struct tensor *token_embd; /* (vocab_size, dim) */
    float *output_norm;              /* (dim,) */
    const struct tensor *output;     /* (vocab_size, dim); == token_embd when tied */
    float *rope_freq_factors;        /* (head_dim / 2,) GGUF rope_freqs.weight, else NULL */
    struct layer_weights *layers;    /* [n_layers] */
    int n_layers;
    size_t matrix_bytes;             /* bytes of all matrices as stored (roofline numerator) */
    /* The read-only file mappings the matrix views point into, borrowed from the loader
     * (the array is owned; weights_add_map). Packing hands the pages of each matrix it
     * copied back to the kernel through them (map_release); none listed (--load-format
     * dummy, hand-built weights) means nothing is released. */
    const struct mapped_file **maps; /* [n_maps] */
    int n_maps;
};

/* Finds and checks every tensor; errors name the file and tensor ("file: tensor
 * 'blk.3.attn_k.weight' has shape [576, 64], expected [576, 192]"; "file: missing
 * tensor 'blk.0.ffn_up.weight'"). The views borrow from g / d, which must outlive w. */
int weights_from_gguf(const struct gguf_file *g, const char *name, const struct model_config *cfg,
                      struct model_weights *w, char *err, size_t errlen);
int weights_from_hf(const struct hf_dir *d, const char *name, const struct model_config *cfg,
                    struct model_weights *w, char *err, size_t errlen);
/* The same over the tensors of --load-format dummy (model/dummy.h), by their HF names. */
struct dummy_weights;
int weights_from_dummy(const struct dummy_weights *dm, const char *name, const struct model_config *cfg,
                       struct model_weights *w, char *err, size_t errlen);
/* Lists map (borrowed: it must outlive w and every copy of w) as a mapping the matrix
 * views may point into. Only for read-only mappings from map_open. Returns 0 or
 * ERR_NOMEM. Called by the model loader after weights_from_gguf / weights_from_hf. */
int weights_add_map(struct model_weights *w, const struct mapped_file *map);
/* The matrix slots of w, for code that rewrites every matrix view (packing,
 * quantization): slots [0, WEIGHTS_MATS_PER_LAYER * n_layers) are each layer's wq, wk, wv,
 * wo, w_gate, w_up, w_down in that order, then the output head, then the token embedding
 * (weights_n_slots in all). A tied head and the embedding are two slots holding the same
 * view. */
#define WEIGHTS_MATS_PER_LAYER 7
int weights_n_slots(const struct model_weights *w);
const struct tensor **weights_slot(struct model_weights *w, int i);

/* Frees the owned F32 arrays, the layer array and the map list (not the views or the
 * mappings). Safe on a zeroed struct. */
void weights_free(struct model_weights *w);

#endif
