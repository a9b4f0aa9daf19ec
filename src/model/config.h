/* config.h — the hyperparameters of a model, read from GGUF metadata or an HF
 * config.json, and validated once.
 *
 * Architecture differences (QKV bias, q/k norm, RoPE layout and scaling) are data here,
 * not separate forwards. A filled struct model_config is immutable.
 */
#ifndef TESSERA_MODEL_CONFIG_H
#define TESSERA_MODEL_CONFIG_H

#include "util/kv_dtype.h"
#include "util/rope.h"

#include <stdbool.h>
#include <stddef.h>

struct gguf_file;
struct cJSON;

enum model_arch {
    ARCH_LLAMA = 0, /* Llama 2/3.x, SmolLM2, Mistral, DeepSeek-R1-Distill-Llama */
    ARCH_QWEN2 = 1, /* q/k/v bias */
    ARCH_QWEN3 = 2, /* per-head q/k RMSNorm, head_dim independent of dim */
};

const char *model_arch_name(enum model_arch a);

struct model_config {
    enum model_arch arch;
    int dim;            /* hidden size */
    int n_layers;
    int n_heads;        /* query heads */
    int n_kv_heads;     /* key/value heads (GQA: divides n_heads) */
    int head_dim;       /* per head; n_heads * head_dim may differ from dim (Qwen3) */
    int ffn_dim;        /* MLP intermediate size */
    int vocab_size;     /* rows of the embedding / output matrices */
    int max_seq_len;    /* trained context length */
    float rms_eps;
    struct rope_params rope;
    enum rope_layout rope_layout;
    bool rope_freq_factors; /* GGUF rope_freqs.weight present (llama3 scaling, GGUF style) */
    bool qkv_bias;
    bool qk_norm;
    bool tied_embeddings;   /* output head = token embedding */
};

/* Fills cfg from GGUF metadata ({arch}.*) and tensor presence (output.weight,
 * rope_freqs.weight). name: the file, for messages. Unsupported architecture ->
 * ERR_UNSUPPORTED naming it; missing/invalid keys -> ERR_FORMAT naming the key. */
int config_from_gguf(const struct gguf_file *g, const char *name, struct model_config *cfg,
                     char *err, size_t errlen);

/* Fills cfg from a parsed HF config.json. has_lm_head: whether lm_head.weight exists
 * (tie_word_embeddings absent or true with no lm_head -> tied). */
int config_from_hf(const struct cJSON *json, const char *name, bool has_lm_head,
                   struct model_config *cfg, char *err, size_t errlen);

/* Checks positive dims, divisibility, absurd sizes. Called by both fillers. */
int config_validate(const struct model_config *cfg, const char *name, char *err, size_t errlen);

#endif
