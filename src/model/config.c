/* config.c — model_config from GGUF metadata or HF config.json, and its validation. */
#include "model/config.h"

#include "loader/gguf.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *model_arch_name(enum model_arch a)
{
    switch (a) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    }
    return "unknown";
}

static void arch_traits(struct model_config *cfg)
{
    cfg->qkv_bias = cfg->arch == ARCH_QWEN2;
    cfg->qk_norm = cfg->arch == ARCH_QWEN3;
}

int config_validate(const struct model_config *c, const char *name, char *err, size_t errlen)
{
    struct { const char *key; int v; int max; } dims[] = {
        { "dim", c->dim, 1 << 16 },          { "n_layers", c->n_layers, 1024 },
        { "n_heads", c->n_heads, 1024 },     { "n_kv_heads", c->n_kv_heads, 1024 },
        { "head_dim", c->head_dim, 1024 },   { "ffn_dim", c->ffn_dim, 1 << 20 },
        { "vocab_size", c->vocab_size, 1 << 24 }, { "max_seq_len", c->max_seq_len, 1 << 24 },
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v <= 0 || dims[i].v > dims[i].max)
            return err_set(err, errlen, ERR_FORMAT, "%s: %s = %d is out of range (1..%d)", name,
                           dims[i].key, dims[i].v, dims[i].max);
    if (c->n_heads % c->n_kv_heads)
        return err_set(err, errlen, ERR_FORMAT, "%s: n_heads %d is not a multiple of n_kv_heads %d",
                       name, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return err_set(err, errlen, ERR_FORMAT, "%s: head_dim %d is odd (RoPE needs pairs)", name,
                       c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > (1 << 17))
        return err_set(err, errlen, ERR_FORMAT, "%s: n_heads * head_dim = %lld is too large", name,
                       (long long)c->n_heads * c->head_dim);
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
        return err_set(err, errlen, ERR_FORMAT, "%s: rms_eps %g is out of range", name, c->rms_eps);
    if (!(c->rope.theta > 1.0 && isfinite(c->rope.theta)))
        return err_set(err, errlen, ERR_FORMAT, "%s: rope_theta %g is out of range", name,
                       c->rope.theta);
    if (c->rope.scaling != ROPE_SCALING_NONE && !(c->rope.factor > 0.0))
        return err_set(err, errlen, ERR_FORMAT, "%s: rope scaling factor %g must be > 0", name,
                       c->rope.factor);
    if (c->rope.scaling == ROPE_SCALING_LLAMA3 &&
        (!(c->rope.low_freq_factor > 0.0) || !(c->rope.high_freq_factor > c->rope.low_freq_factor) ||
         c->rope.original_max_position_embeddings <= 0))
        return err_set(err, errlen, ERR_FORMAT,
                       "%s: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings > 0",
                       name);
    return 0;
}

/* ---- GGUF ----------------------------------------------------------------------------- */

static int gguf_int_key(const struct gguf_file *g, const char *name, const char *arch,
                        const char *suffix, int required, int *out, char *err, size_t errlen)
{
    char key[128];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_int(g, key, &v, err, errlen);
    if (rc == ERR_NOT_FOUND) {
        if (!required) return 0;
        return err_set(err, errlen, ERR_FORMAT, "%s: missing metadata key '%s'", name, key);
    }
    if (rc) return rc;
    if (v <= 0 || v > INT32_MAX)
        return err_set(err, errlen, ERR_FORMAT, "%s: metadata '%s' = %lld is out of range", name, key,
                       (long long)v);
    *out = (int)v;
    return 0;
}

static int gguf_float_key(const struct gguf_file *g, const char *arch, const char *suffix,
                          double *out, char *err, size_t errlen)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = gguf_get_float(g, key, out, err, errlen);
    return rc == ERR_NOT_FOUND ? 0 : rc;
}

int config_from_gguf(const struct gguf_file *g, const char *name, struct model_config *cfg,
                     char *err, size_t errlen)
{
    struct gguf_str s;
    char arch[64];
    int rc;
    memset(cfg, 0, sizeof *cfg);
    rc = gguf_get_str(g, "general.architecture", &s, err, errlen);
    if (rc == ERR_NOT_FOUND)
        return err_set(err, errlen, ERR_FORMAT, "%s: missing metadata key 'general.architecture'", name);
    if (rc) return rc;
    snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 63 ? s.len : 63), s.ptr);
    if (!strcmp(arch, "llama")) cfg->arch = ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2")) cfg->arch = ARCH_QWEN2;
    else if (!strcmp(arch, "qwen3")) cfg->arch = ARCH_QWEN3;
    else
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "%s: unsupported architecture '%s' (supported: llama, qwen2, qwen3)", name, arch);
    arch_traits(cfg);
    /* The GGUF converter permutes llama's Q/K rows for the adjacent-pair rotation;
     * qwen2/qwen3 are stored unpermuted and rotate halves. */
    cfg->rope_layout = cfg->arch == ARCH_LLAMA ? ROPE_NORMAL : ROPE_NEOX;

    if ((rc = gguf_int_key(g, name, arch, "block_count", 1, &cfg->n_layers, err, errlen)) ||
        (rc = gguf_int_key(g, name, arch, "embedding_length", 1, &cfg->dim, err, errlen)) ||
        (rc = gguf_int_key(g, name, arch, "feed_forward_length", 1, &cfg->ffn_dim, err, errlen)) ||
        (rc = gguf_int_key(g, name, arch, "attention.head_count", 1, &cfg->n_heads, err, errlen)))
        return rc;
    cfg->n_kv_heads = cfg->n_heads;
    if ((rc = gguf_int_key(g, name, arch, "attention.head_count_kv", 0, &cfg->n_kv_heads, err, errlen)))
        return rc;
    cfg->head_dim = cfg->n_heads > 0 ? cfg->dim / cfg->n_heads : 0;
    if ((rc = gguf_int_key(g, name, arch, "attention.key_length", 0, &cfg->head_dim, err, errlen)))
        return rc;
    int vlen = cfg->head_dim, rope_dim = cfg->head_dim;
    if ((rc = gguf_int_key(g, name, arch, "attention.value_length", 0, &vlen, err, errlen)) ||
        (rc = gguf_int_key(g, name, arch, "rope.dimension_count", 0, &rope_dim, err, errlen)))
        return rc;
    if (vlen != cfg->head_dim)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: value_length %d != key_length %d", name,
                       vlen, cfg->head_dim);
    if (rope_dim != cfg->head_dim)
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "%s: partial rotary embeddings (rope.dimension_count %d, head_dim %d)", name,
                       rope_dim, cfg->head_dim);
    cfg->max_seq_len = 4096;
    if ((rc = gguf_int_key(g, name, arch, "context_length", 0, &cfg->max_seq_len, err, errlen)))
        return rc;

    double eps = 1e-5, theta = 10000.0;
    if ((rc = gguf_float_key(g, arch, "attention.layer_norm_rms_epsilon", &eps, err, errlen)) ||
        (rc = gguf_float_key(g, arch, "rope.freq_base", &theta, err, errlen)))
        return rc;
    cfg->rms_eps = (float)eps;
    cfg->rope.theta = theta;

    /* Rope scaling: "linear" via metadata; llama3 via the rope_freqs.weight tensor. */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    rc = gguf_get_str(g, key, &s, err, errlen);
    if (rc && rc != ERR_NOT_FOUND) return rc;
    if (!rc && !(s.len == 4 && !memcmp(s.ptr, "none", 4))) {
        if (s.len == 6 && !memcmp(s.ptr, "linear", 6)) {
            cfg->rope.scaling = ROPE_SCALING_LINEAR;
            cfg->rope.factor = 1.0;
            if ((rc = gguf_float_key(g, arch, "rope.scaling.factor", &cfg->rope.factor, err, errlen)))
                return rc;
        } else {
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: unsupported rope scaling type '%.*s'",
                           name, (int)(s.len < 64 ? s.len : 64), s.ptr);
        }
    }
    cfg->rope_freq_factors = gguf_find_tensor(g, "rope_freqs.weight") != NULL;

    /* Vocabulary: the token list is authoritative; fall back to the embedding rows. */
    enum gguf_vtype et;
    uint64_t n_tok = 0;
    rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok, err, errlen);
    if (rc && rc != ERR_NOT_FOUND) return rc;
    const struct tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    if (n_tok > 0 && n_tok <= INT32_MAX) cfg->vocab_size = (int)n_tok;
    else if (emb && emb->n_dims == 2 && emb->ne[1] <= INT32_MAX) cfg->vocab_size = (int)emb->ne[1];
    cfg->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    return config_validate(cfg, name, err, errlen);
}

/* ---- HF config.json ------------------------------------------------------------------- */

static int json_int(const cJSON *j, const char *name, const char *key, int required, int *out,
                    char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) {
        if (!required) return 0;
        return err_set(err, errlen, ERR_FORMAT, "%s: config.json lacks '%s'", name, key);
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble <= 0 ||
        v->valuedouble > INT32_MAX)
        return err_set(err, errlen, ERR_FORMAT, "%s: config.json '%s' must be a positive integer",
                       name, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int json_num(const cJSON *j, const char *name, const char *key, double *out, char *err,
                    size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v))
        return err_set(err, errlen, ERR_FORMAT, "%s: config.json '%s' must be a number", name, key);
    *out = v->valuedouble;
    return 0;
}

static int hf_arch(const cJSON *j, const char *name, enum model_arch *out, char *err, size_t errlen)
{
    static const struct { const char *cls, *type; enum model_arch arch; } known[] = {
        { "LlamaForCausalLM", "llama", ARCH_LLAMA },
        { "MistralForCausalLM", "mistral", ARCH_LLAMA },
        { "Qwen2ForCausalLM", "qwen2", ARCH_QWEN2 },
        { "Qwen3ForCausalLM", "qwen3", ARCH_QWEN3 },
    };
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const char *cls = NULL;
    if (cJSON_IsArray(archs) && cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        cls = cJSON_GetArrayItem(archs, 0)->valuestring;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if ((cls && !strcmp(cls, known[i].cls)) ||
            (!cls && cJSON_IsString(type) && !strcmp(type->valuestring, known[i].type))) {
            *out = known[i].arch;
            return 0;
        }
    }
    return err_set(err, errlen, ERR_UNSUPPORTED,
                   "%s: unsupported architecture '%s' (supported: LlamaForCausalLM, "
                   "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                   name, cls ? cls : cJSON_IsString(type) ? type->valuestring : "(none)");
}

static int hf_rope_scaling(const cJSON *j, const char *name, struct rope_params *r, char *err,
                           size_t errlen)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (!rs || cJSON_IsNull(rs)) return 0;
    if (!cJSON_IsObject(rs))
        return err_set(err, errlen, ERR_FORMAT, "%s: config.json 'rope_scaling' must be an object", name);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    int rc;
    if (!strcmp(type, "default")) return 0;
    if (!strcmp(type, "linear")) {
        r->scaling = ROPE_SCALING_LINEAR;
        return json_num(rs, name, "factor", &r->factor, err, errlen);
    }
    if (!strcmp(type, "llama3")) {
        r->scaling = ROPE_SCALING_LLAMA3;
        if ((rc = json_num(rs, name, "factor", &r->factor, err, errlen)) ||
            (rc = json_num(rs, name, "low_freq_factor", &r->low_freq_factor, err, errlen)) ||
            (rc = json_num(rs, name, "high_freq_factor", &r->high_freq_factor, err, errlen)) ||
            (rc = json_int(rs, name, "original_max_position_embeddings", 1,
                           &r->original_max_position_embeddings, err, errlen)))
            return rc;
        return 0;
    }
    return err_set(err, errlen, ERR_UNSUPPORTED, "%s: unsupported rope_scaling type '%s'", name, type);
}

int config_from_hf(const struct cJSON *json, const char *name, bool has_lm_head,
                   struct model_config *cfg, char *err, size_t errlen)
{
    const cJSON *j = json;
    int rc;
    memset(cfg, 0, sizeof *cfg);
    if (!cJSON_IsObject(j))
        return err_set(err, errlen, ERR_FORMAT, "%s: config.json is not an object", name);
    if ((rc = hf_arch(j, name, &cfg->arch, err, errlen))) return rc;
    arch_traits(cfg);
    /* HF attention rotates halves for every supported architecture. */
    cfg->rope_layout = ROPE_NEOX;
    if ((rc = json_int(j, name, "hidden_size", 1, &cfg->dim, err, errlen)) ||
        (rc = json_int(j, name, "num_hidden_layers", 1, &cfg->n_layers, err, errlen)) ||
        (rc = json_int(j, name, "num_attention_heads", 1, &cfg->n_heads, err, errlen)) ||
        (rc = json_int(j, name, "intermediate_size", 1, &cfg->ffn_dim, err, errlen)) ||
        (rc = json_int(j, name, "vocab_size", 1, &cfg->vocab_size, err, errlen)))
        return rc;
    cfg->n_kv_heads = cfg->n_heads;
    cfg->head_dim = cfg->dim / cfg->n_heads;
    cfg->max_seq_len = 4096;
    if ((rc = json_int(j, name, "num_key_value_heads", 0, &cfg->n_kv_heads, err, errlen)) ||
        (rc = json_int(j, name, "head_dim", 0, &cfg->head_dim, err, errlen)) ||
        (rc = json_int(j, name, "max_position_embeddings", 0, &cfg->max_seq_len, err, errlen)))
        return rc;
    /* Sliding-window attention (Mistral 7B v0.1: 4096 of 32768) is not implemented; up to
     * the window it equals full attention, so the context stops there. Qwen2 configs carry
     * a window with use_sliding_window: false. */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    const cJSON *use_sw = cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window");
    if (cJSON_IsNumber(sw) && !cJSON_IsFalse(use_sw)) {
        int window = 0;
        if ((rc = json_int(j, name, "sliding_window", 1, &window, err, errlen))) return rc;
        if (window < cfg->max_seq_len) cfg->max_seq_len = window;
    }
    double eps = 1e-6, theta = 10000.0;
    if ((rc = json_num(j, name, "rms_norm_eps", &eps, err, errlen)) ||
        (rc = json_num(j, name, "rope_theta", &theta, err, errlen)))
        return rc;
    cfg->rms_eps = (float)eps;
    cfg->rope.theta = theta;
    if ((rc = hf_rope_scaling(j, name, &cfg->rope, err, errlen))) return rc;
    /* Qwen2 configs may say attention_bias is absent; Llama configs may set it. */
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(j, "attention_bias");
    if (cJSON_IsBool(ab) && cJSON_IsTrue(ab) && cfg->arch == ARCH_LLAMA)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: llama with attention_bias is not supported", name);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    bool tie_flag = cJSON_IsBool(tie) ? cJSON_IsTrue(tie) : false;
    cfg->tied_embeddings = tie_flag || !has_lm_head;
    return config_validate(cfg, name, err, errlen);
}
