/* model.c — model_load / model_free: opens a GGUF file or an HF directory and assembles
 * config, weights, tokenizer, chat template, end-of-generation ids and generation
 * defaults. Everything opened here is owned by struct model and released by model_free.
 * The weights list the file mappings their matrices live in (model_weights.maps), so
 * that packing can give back the pages it copied; random dummy weights list none.
 */
#define _POSIX_C_SOURCE 200809L
#include "model/model.h"

#include "loader/gguf.h"
#include "loader/safetensors.h"
#include "model/dummy.h"
#include "model/weights_convert.h"
#include "template/jinja.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Tokens that end a turn in the chat formats we serve (as llama.cpp collects them). The
 * SmolLM2 GGUF, for one, names <|im_start|> as eos in some conversions; <|im_end|> must
 * still end the assistant's turn. */
static const char *const eog_names[] = {
    "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "</s>",
};

static void add_eog(struct model *m, int id)
{
    if (id < 0 || id >= m->cfg.vocab_size || m->n_eog >= MODEL_MAX_EOG) return;
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog_ids[i] == id) return;
    m->eog_ids[m->n_eog++] = id;
}

bool model_is_eog(const struct model *m, int32_t id)
{
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog_ids[i] == id) return true;
    return false;
}

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static int parse_template(struct model *m, char *err, size_t errlen)
{
    if (!m->chat_template) return 0;
    char msg[ERR_BUF];
    int rc = jinja_parse(m->chat_template, strlen(m->chat_template), &m->tmpl, msg, sizeof msg);
    if (rc) return err_set(err, errlen, rc, "%s: chat template: %s", m->path, msg);
    return 0;
}

/* Token string of id from the GGUF token list, or NULL. */
static char *gguf_token_str(const struct gguf_file *g, int64_t id)
{
    enum gguf_vtype et;
    uint64_t n;
    if (id < 0 || gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, NULL, 0) || et != GGUF_STRING ||
        (uint64_t)id >= n)
        return NULL;
    struct gguf_str s = gguf_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)id);
    return dup_n(s.ptr, s.len);
}

static int load_gguf(struct model *m, unsigned flags, char *err, size_t errlen)
{
    int rc;
    if ((rc = map_open(m->path, &m->map, err, errlen))) return rc;
    if ((rc = gguf_parse(m->map.data, m->map.size, m->path, &m->gguf, err, errlen))) return rc;
    if ((rc = config_from_gguf(m->gguf, m->path, &m->cfg, err, errlen))) return rc;
    if ((rc = weights_from_gguf(m->gguf, m->path, &m->cfg, &m->w, err, errlen))) return rc;
    if (weights_add_map(&m->w, &m->map)) return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", m->path);

    struct gguf_str s;
    if (!gguf_get_str(m->gguf, "general.name", &s, NULL, 0) && s.len > 0)
        snprintf(m->name, sizeof m->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
    if (flags & MODEL_LOAD_NO_TOKENIZER) return 0;

    char sub[ERR_BUF];
    if ((rc = tok_load_gguf(m->gguf, &m->tok, sub, sizeof sub)))
        return err_set(err, errlen, rc, "%s: %s", m->path, sub);
    if (!gguf_get_str(m->gguf, "tokenizer.chat_template", &s, NULL, 0)) {
        if (!(m->chat_template = dup_n(s.ptr, s.len)))
            return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", m->path);
    }
    int64_t id;
    if (!gguf_get_int(m->gguf, "tokenizer.ggml.bos_token_id", &id, NULL, 0))
        m->bos_token = gguf_token_str(m->gguf, id);
    if (!gguf_get_int(m->gguf, "tokenizer.ggml.eos_token_id", &id, NULL, 0)) {
        m->eos_token = gguf_token_str(m->gguf, id);
        add_eog(m, (int)id);
    }
    if (!gguf_get_int(m->gguf, "tokenizer.ggml.eot_token_id", &id, NULL, 0)) add_eog(m, (int)id);
    return 0;
}

/* config.json's eos_token_id (an int or a list), used when generation_config.json
 * gives none. */
static void add_config_eos(struct model *m, const cJSON *config)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(config, "eos_token_id");
    if (cJSON_IsNumber(e)) {
        add_eog(m, e->valueint);
        return;
    }
    const cJSON *item;
    if (cJSON_IsArray(e))
        cJSON_ArrayForEach(item, e)
            if (cJSON_IsNumber(item)) add_eog(m, item->valueint);
}

static int load_hf(struct model *m, unsigned flags, char *err, size_t errlen)
{
    int rc;
    if (flags & MODEL_LOAD_DUMMY) {
        /* config.json decides tie_word_embeddings alone: there is no lm_head to look for */
        if ((rc = hf_open_config_only(m->path, &m->hf, err, errlen)) ||
            (rc = config_from_hf(hf_config(m->hf), m->path, true, &m->cfg, err, errlen)) ||
            (rc = dummy_weights_create(&m->cfg, &m->dummy, err, errlen)) ||
            (rc = weights_from_dummy(m->dummy, m->path, &m->cfg, &m->w, err, errlen)))
            return rc;
    } else {
        if ((rc = hf_open(m->path, &m->hf, err, errlen))) return rc;
        bool has_head = hf_find_tensor(m->hf, "lm_head.weight") != NULL;
        if ((rc = config_from_hf(hf_config(m->hf), m->path, has_head, &m->cfg, err, errlen))) return rc;
        if ((rc = weights_from_hf(m->hf, m->path, &m->cfg, &m->w, err, errlen))) return rc;
        for (int i = 0; i < hf_n_maps(m->hf); i++)
            if (weights_add_map(&m->w, hf_map(m->hf, i)))
                return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", m->path);
    }

    /* display name: the directory's last component */
    size_t n = strlen(m->path);
    while (n > 1 && m->path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && m->path[b - 1] != '/') b--;
    snprintf(m->name, sizeof m->name, "%.*s", (int)(n - b < 127 ? n - b : 127), m->path + b);

    const struct hf_generation_config *gc = hf_generation_config(m->hf);
    m->gen.temperature = gc->temperature;
    m->gen.top_p = gc->top_p;
    m->gen.top_k = gc->top_k;
    m->gen.repetition_penalty = gc->repetition_penalty;
    for (int i = 0; i < gc->n_eos; i++) add_eog(m, gc->eos_ids[i]);
    if (gc->n_eos == 0) add_config_eos(m, hf_config(m->hf)); /* no generation_config.json */
    if (flags & MODEL_LOAD_NO_TOKENIZER) return 0;

    /* tokenizer.json, then tokenizer_config.json (BOS/EOS rules), as transformers does */
    if ((rc = tok_load_hf_dir(m->path, &m->tok, err, errlen))) return rc;
    const struct hf_tokenizer_config *tc = hf_tokenizer_config(m->hf);
    if ((tc->chat_template && !(m->chat_template = strdup(tc->chat_template))) ||
        (tc->bos_token && !(m->bos_token = strdup(tc->bos_token))) ||
        (tc->eos_token && !(m->eos_token = strdup(tc->eos_token))))
        return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", m->path);
    if (m->eos_token) add_eog(m, tok_find(m->tok, m->eos_token));
    return 0;
}

int model_convert_flags(const char *quantization, const char *dtype, unsigned *flags)
{
    unsigned f = *flags;
    if (quantization) {
        if (strcmp(quantization, "none") && strcmp(quantization, "q8_0")) return -1;
        f = !strcmp(quantization, "q8_0") ? f | MODEL_LOAD_Q8_0 : f & ~(unsigned)MODEL_LOAD_Q8_0;
    }
    if (dtype) {
        const bool bf16 = !strcmp(dtype, "bfloat16"), f16 = !strcmp(dtype, "float16") || !strcmp(dtype, "half");
        if (!bf16 && !f16 && strcmp(dtype, "auto")) return -1;
        f &= ~(unsigned)(MODEL_LOAD_BF16 | MODEL_LOAD_F16);
        f |= bf16 ? MODEL_LOAD_BF16 : f16 ? MODEL_LOAD_F16 : 0;
    }
    *flags = f;
    return 0;
}

int model_load(const char *path, unsigned flags, struct model **out, char *err, size_t errlen)
{
    struct stat st;
    *out = NULL;
    if (stat(path, &st) != 0) return err_set(err, errlen, ERR_IO, "%s: no such file or directory", path);
    struct model *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return err_set(err, errlen, ERR_NOMEM, "%s: out of memory", path);
    }
    m->gen.temperature = m->gen.top_p = m->gen.repetition_penalty = -1.0;
    m->gen.top_k = -1;
    m->source = S_ISDIR(st.st_mode) ? MODEL_HF : MODEL_GGUF;
    if ((flags & MODEL_LOAD_DUMMY) && m->source != MODEL_HF) {
        free(m->path);
        free(m);
        return err_set(err, errlen, ERR_INVALID,
                       "%s: --load-format dummy needs a Hugging Face model directory (config.json)", path);
    }
    m->random_weights = (flags & MODEL_LOAD_DUMMY) != 0;
    int rc = m->source == MODEL_HF ? load_hf(m, flags, err, errlen) : load_gguf(m, flags, err, errlen);
    if (rc) goto fail;
    const enum dtype to = (flags & MODEL_LOAD_Q8_0)  ? DT_Q8_0
                          : (flags & MODEL_LOAD_F16)  ? DT_F16
                          : (flags & MODEL_LOAD_BF16) ? DT_BF16
                                                      : DT_COUNT_;
    if (to != DT_COUNT_) {
        char sub[ERR_BUF];
        if ((rc = weights_convert(&m->converted, &m->w, to, sub, sizeof sub))) {
            err_set(err, errlen, rc, "%s: %s", path, sub);
            goto fail;
        }
        if (m->dummy && m->converted->n_kept == 0) { /* nothing reads the random bytes any more */
            dummy_weights_free(m->dummy);
            m->dummy = NULL;
        }
    }
    if (!m->name[0]) { /* GGUF without general.name: the file name */
        const char *slash = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", slash ? slash + 1 : path);
    }
    if (m->tok) {
        add_eog(m, tok_eos_id(m->tok));
        for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0]; i++)
            add_eog(m, tok_find(m->tok, eog_names[i]));
        if ((rc = parse_template(m, err, errlen))) goto fail;
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    if (!m) return;
    weights_free(&m->w);
    converted_weights_free(m->converted);
    dummy_weights_free(m->dummy);
    if (m->tmpl) jinja_free(m->tmpl);
    if (m->tok) tok_free(m->tok);
    if (m->gguf) gguf_free(m->gguf);
    if (m->hf) hf_close(m->hf);
    if (m->map.data) map_close(&m->map);
    free(m->chat_template);
    free(m->bos_token);
    free(m->eos_token);
    free(m->path);
    free(m);
}

size_t model_release_converted(struct model *m) { return converted_weights_release(m->converted); }

size_t model_release_converted_packed(struct model *m)
{
    return converted_weights_release_packed(m->converted, m->w.token_embd);
}

void model_describe(const struct model *m, char *buf, size_t len)
{
    const struct model_config *c = &m->cfg;
    static const char *scal[] = { "none", "linear", "llama3" };
    char quant[128] = ""; /* --quantization / --dtype */
    const struct converted_weights *cv = m->converted;
    if (cv && cv->n_converted)
        snprintf(quant, sizeof quant, ", %d matrices %s at load in %.1f s from %.1f MiB", cv->n_converted,
                 cv->to == DT_Q8_0 ? "quantized" : "converted", cv->seconds,
                 (double)cv->bytes_before / (1024.0 * 1024.0));
    snprintf(buf, len,
             "%s (%s, %s): %d layers, dim %d, heads %d/%d x %d, ffn %d, vocab %d, ctx %d, "
             "rope %s theta %g scaling %s%s%s%s%s, weights %.1f MiB (%s%s%s)",
             m->name, model_arch_name(c->arch), m->source == MODEL_HF ? "hf" : "gguf", c->n_layers,
             c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->vocab_size, c->max_seq_len,
             c->rope_layout == ROPE_NEOX ? "neox" : "normal", c->rope.theta, scal[c->rope.scaling],
             c->rope_freq_factors ? "+freq_factors" : "", c->qkv_bias ? ", qkv bias" : "",
             c->qk_norm ? ", qk norm" : "", c->tied_embeddings ? ", tied" : "",
             (double)m->w.matrix_bytes / (1024.0 * 1024.0), dtype_name(m->w.layers[0].wq->type),
             quant,
             m->random_weights ? ", random: --load-format dummy" : "");
}
