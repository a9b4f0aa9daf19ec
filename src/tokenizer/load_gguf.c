/* load_gguf.c — builds a struct tokenizer from GGUF metadata (tokenizer.ggml.*), so that
 * it encodes as Hugging Face `tokenizers` does with the model's own tokenizer.json.
 *
 * tokenizer.ggml.model "gpt2" is byte-level BPE: tokens/merges give the BPE model;
 * tokenizer.ggml.pre picks the normalizer and pre-tokenizer of that model family's
 * tokenizer.json (the table below; the same table is in tests/python/gguf_tokenizer.py,
 * which builds the reference tokenizer the tests compare against), and whether the
 * family's BPE has ignore_merges (Llama 3: a word that is a vocab entry is one token
 * even when no merge path leads to it; GGUF has no key for it, llama.cpp sets it by pre
 * as well).
 *
 * "llama" is SentencePiece BPE (Llama 2, Mistral, Phi-3, Gemma): tokens and scores, no
 * merges; it becomes what transformers' converter writes for these models: merges
 * derived from the scores, byte fallback to the <0xXX> tokens, unk fusing, the normalizer
 * Prepend("▁") (unless tokenizer.ggml.add_space_prefix is false) + Replace(" ", "▁"), no
 * pre-tokenizer, and the decoder Replace("▁", " ") + ByteFallback + Fuse + Strip(1).
 *
 * In both, token_type 3 (control) and 2 (unknown) tokens become special added tokens and
 * 4 (user-defined) plain added tokens, all matched in the text before anything else.
 */
#include "tokenizer/tok_internal.h"

#include "loader/gguf.h"
#include "util/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT2_RE tok_gpt2_regex

static const char llama3_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5: letters with their combining marks */
static const char qwen35_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char deepseek_llm_letters[] =
    "\\s?[A-Za-z\\x{b5}\\x{c0}-\\x{d6}\\x{d8}-\\x{f6}\\x{f8}-\\x{1ba}\\x{1bc}-\\x{1bf}\\x{1c4}"
    "-\\x{293}\\x{295}-\\x{2af}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37b}-\\x{37d}\\x{37f}"
    "\\x{386}\\x{388}-\\x{38a}\\x{38c}\\x{38e}-\\x{3a1}\\x{3a3}-\\x{3f5}\\x{3f7}-\\x{481}"
    "\\x{48a}-\\x{52f}\\x{531}-\\x{556}\\x{10a0}-\\x{10c5}\\x{13a0}-\\x{13f5}\\x{13f8}-"
    "\\x{13fd}\\x{1c90}-\\x{1cba}\\x{1cbd}-\\x{1cbf}\\x{1d00}-\\x{1d2b}\\x{1d6b}-"
    "\\x{1d77}\\x{1d79}-\\x{1d9a}\\x{1e00}-\\x{1f15}\\x{1f18}-\\x{1f1d}\\x{1f20}-"
    "\\x{1f45}\\x{1f48}-\\x{1f4d}\\x{1f50}-\\x{1f57}\\x{1f59}\\x{1f5b}\\x{1f5d}\\x{1f5f}-"
    "\\x{1f7d}\\x{1f80}-\\x{1fb4}\\x{1fb6}-\\x{1fbc}\\x{1fbe}\\x{1fc2}-\\x{1fc4}\\x{1fc6}"
    "-\\x{1fcc}\\x{1fd0}-\\x{1fd3}\\x{1fd6}-\\x{1fdb}\\x{1fe0}-\\x{1fec}\\x{1ff2}-"
    "\\x{1ff4}\\x{1ff6}-\\x{1ffc}\\x{2102}\\x{2107}\\x{210a}-\\x{2113}\\x{2115}\\x{2119}-"
    "\\x{211d}\\x{2124}\\x{2126}\\x{2128}\\x{212a}-\\x{212d}\\x{212f}-\\x{2134}\\x{2139}"
    "\\x{213c}-\\x{213f}\\x{2145}-\\x{2149}\\x{214e}\\x{2183}\\x{2184}\\x{2c00}-\\x{2c7b}"
    "\\x{2c7e}-\\x{2ce4}\\x{2ceb}-\\x{2cee}\\x{2cf2}\\x{2cf3}\\x{a640}-\\x{a66d}\\x{a680}"
    "-\\x{a69b}\\x{a722}-\\x{a76f}\\x{a771}-\\x{a787}\\x{a78b}-\\x{a78e}\\x{ab70}-"
    "\\x{abbf}\\x{fb00}-\\x{fb06}\\x{fb13}-\\x{fb17}\\x{ff21}-\\x{ff3a}\\x{ff41}-"
    "\\x{ff5a}\\x{10400}-\\x{1044f}\\x{104b0}-\\x{104d3}\\x{104d8}-\\x{104fb}\\x{10c80}-"
    "\\x{10cb2}\\x{10cc0}-\\x{10cf2}\\x{118a0}-\\x{118df}\\x{1e900}-\\x{1e943}]+";
static const char deepseek_v3_main[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/* tokenizer.ggml.pre -> the normalizer and pre-tokenizer of the family's tokenizer.json:
 * Split(Regex) steps (behaviour as given), then ByteLevel without its regex. PRE_BL marks
 * a ByteLevel in the middle: the steps after it see the GPT-2 alphabet (Falcon). */
#define PRE_BL "\x01"
struct pre_step {
    const char *re;
    enum tok_split_behavior b;
};
#define ISO TOK_SPLIT_ISOLATED
static const struct pre_def {
    const char *names[4];
    bool nfc;           /* the tokenizer.json has an NFC normalizer */
    bool ignore_merges; /* ... and its BPE ignore_merges: true */
    bool add_bos;       /* default of tokenizer.ggml.add_bos_token (llama.cpp's) */
    struct pre_step steps[6];
} pre_defs[] = {
    { { "gpt-2", "gpt2", "default", "phi-2" }, false, false, false, { { GPT2_RE, ISO } } },
    /* GPT-NeoX's tokenizer (MPT): ByteLevel with an NFC normalizer */
    { { "mpt", NULL }, true, false, false, { { GPT2_RE, ISO } } },
    { { "smollm", "starcoder", "refact", NULL }, false, false, false, { { "\\p{N}", ISO }, { GPT2_RE, ISO } } },
    { { "command-r", NULL }, true, false, false, { { "\\p{N}", ISO }, { GPT2_RE, ISO } } },
    { { "llama-bpe", "llama3", "llama-v3", NULL }, false, true, true, { { llama3_re, ISO } } },
    { { "qwen2", "deepseek-r1-qwen", NULL }, true, false, false, { { qwen2_re, ISO } } },
    /* Qwen3.5: its tokenizer.json has no normalizer (llama.cpp's vectors hold decomposed text) */
    { { "qwen35", NULL }, false, false, false, { { qwen35_re, ISO } } },
    { { "deepseek-llm", NULL }, false, false, false,
      { { "[\r\n]", ISO }, { deepseek_llm_letters, ISO }, { "\\s?[!-/:-~！-／：-～‘-‟　-。]+", ISO },
        { "\\s+$", ISO }, { "[一-龥ࠀ-一가-퟿]+", ISO }, { "\\p{N}+", ISO } } },
    { { "deepseek-coder", NULL }, false, false, false,
      { { "[\r\n]", ISO }, { "\\s?\\p{L}+", ISO }, { "\\s?\\p{P}+", ISO }, { "[一-龥ࠀ-一가-퟿]+", ISO },
        { "\\p{N}", ISO } } },
    { { "deepseek-v3", NULL }, false, false, false,
      { { "\\p{N}{1,3}", ISO }, { "[一-龥぀-ゟ゠-ヿ]+", ISO }, { deepseek_v3_main, ISO } } },
    /* Falcon: Punctuation(Contiguous), ByteLevel(use_regex), then on the alphabet
     * Digits (runs) and Split("[0-9][0-9][0-9]") */
    { { "falcon", NULL }, false, false, false,
      { { tok_punct_regex, TOK_SPLIT_CONTIGUOUS }, { GPT2_RE, ISO }, { PRE_BL, ISO }, { "\\p{N}+", ISO },
        { "[0-9][0-9][0-9]", ISO } } },
};
#undef ISO

static const struct pre_def *find_pre(const char *name, size_t n)
{
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        for (int k = 0; k < 4 && pre_defs[i].names[k]; k++)
            if (strlen(pre_defs[i].names[k]) == n && memcmp(pre_defs[i].names[k], name, n) == 0)
                return &pre_defs[i];
    return NULL;
}

/* "a, b, c" of every supported pre name, for the refusal message. */
static void pre_names(char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++)
        for (int k = 0; k < 4 && pre_defs[i].names[k]; k++) {
            int w = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", pre_defs[i].names[k]);
            if (w < 0 || (size_t)w >= cap - o)
                return;
            o += (size_t)w;
        }
}

/* tokens and token_type into pieces; control (3) and unknown (2) are special added
 * tokens, user-defined (4) plain added ones. Returns the token count in *n_out. */
static int load_pieces(struct tokenizer *t, const struct gguf_file *g, uint64_t *n_out, char *err, size_t errlen)
{
    enum gguf_vtype et;
    uint64_t n_tok, n_type = 0;
    int rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n_tok, err, errlen);
    if (rc == ERR_NOT_FOUND)
        return err_set(err, errlen, ERR_FORMAT, "GGUF has no tokenizer.ggml.tokens");
    if (rc < 0)
        return rc;
    if (et != GGUF_STRING || n_tok == 0 || n_tok >= (1u << 24))
        return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.tokens must be 1..16777215 strings");
    bool have_types = false;
    rc = gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n_type, err, errlen);
    if (rc == 0) {
        if (n_type != n_tok || et == GGUF_STRING || et == GGUF_ARRAY || et == GGUF_FLOAT32 || et == GGUF_FLOAT64)
            return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.token_type must be %llu integers",
                           (unsigned long long)n_tok);
        have_types = true;
    } else if (rc != ERR_NOT_FOUND) {
        return rc;
    }
    for (uint64_t i = 0; i < n_tok; i++) {
        struct gguf_str s = gguf_arr_str(g, "tokenizer.ggml.tokens", i);
        int64_t ty = have_types ? gguf_arr_int(g, "tokenizer.ggml.token_type", i) : 1;
        uint8_t f = ty == 3 || ty == 2 ? (TOK_F_ADDED | TOK_F_SPECIAL) : ty == 4 ? TOK_F_ADDED : 0;
        rc = tok_set_piece(t, (int32_t)i, s.ptr, (size_t)s.len, f, err, errlen);
        if (rc < 0)
            return rc;
    }
    *n_out = n_tok;
    return 0;
}

/* model "gpt2": merges and the pre table. */
static int load_gpt2(struct tokenizer *t, const struct gguf_file *g, bool *add_bos, char *err, size_t errlen)
{
    struct gguf_str pre = { "default", 7 };
    int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    const struct pre_def *pd = find_pre(pre.ptr, pre.len);
    if (!pd) {
        char names[512];
        pre_names(names, sizeof names);
        return err_set(err, errlen, ERR_UNSUPPORTED, "tokenizer.ggml.pre \"%.*s\" is not supported (supported: %s)",
                       (int)(pre.len > 64 ? 64 : pre.len), pre.ptr, names);
    }
    uint64_t n_tok, n_merges = 0;
    enum gguf_vtype et;
    if ((rc = load_pieces(t, g, &n_tok, err, errlen)) < 0)
        return rc;
    char sub[ERR_BUF];
    if ((rc = tok_finish_vocab(t, sub, sizeof sub)) < 0)
        return err_set(err, errlen, rc, "GGUF tokenizer: %s", sub);

    rc = gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    if (rc == 0 && et != GGUF_STRING)
        return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.merges must be strings");
    if (rc == 0 && n_merges >= (1u << 30))
        return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.merges has %llu entries", (unsigned long long)n_merges);
    for (uint64_t i = 0; rc == 0 && i < n_merges; i++) {
        struct gguf_str s = gguf_arr_str(g, "tokenizer.ggml.merges", i);
        const char *sp = s.len ? memchr(s.ptr, ' ', (size_t)s.len) : NULL;
        if (!sp)
            return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.merges[%llu] \"%.*s\" has no space",
                           (unsigned long long)i, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        size_t na = (size_t)(sp - s.ptr);
        int r = tok_add_merge(t, s.ptr, na, sp + 1, (size_t)s.len - na - 1, (int32_t)i, sub, sizeof sub);
        if (r < 0)
            return err_set(err, errlen, r, "tokenizer.ggml.merges: %s", sub);
    }

    t->ignore_merges = pd->ignore_merges;
    *add_bos = pd->add_bos;
    if (pd->nfc && (rc = tok_add_norm(t, TOK_NORM_NFC, NULL, NULL, err, errlen)) < 0)
        return rc;
    for (int k = 0; k < 6 && pd->steps[k].re; k++) {
        const char *re = pd->steps[k].re;
        if (strcmp(re, PRE_BL) == 0) {
            if (!tok_step_add(t, TOK_STEP_BYTELEVEL, err, errlen))
                return ERR_UNSUPPORTED;
            continue;
        }
        rc = tok_step_add_split(t, re, strlen(re), false, pd->steps[k].b, false, "tokenizer.ggml.pre", err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* model "llama": SentencePiece BPE, as transformers' converter writes it (file comment). */
static int load_llama(struct tokenizer *t, const struct gguf_file *g, bool *add_bos, char *err, size_t errlen)
{
    uint64_t n_tok, n_scores;
    enum gguf_vtype et;
    int rc = load_pieces(t, g, &n_tok, err, errlen);
    if (rc < 0)
        return rc;
    rc = gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n_scores, err, errlen);
    if (rc == ERR_NOT_FOUND)
        return err_set(err, errlen, ERR_FORMAT, "GGUF tokenizer.ggml.model \"llama\" has no tokenizer.ggml.scores");
    if (rc < 0)
        return rc;
    if (n_scores != n_tok || (et != GGUF_FLOAT32 && et != GGUF_FLOAT64))
        return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.scores must be %llu floats", (unsigned long long)n_tok);
    t->byte_level = false;
    t->byte_fallback = true;
    t->fuse_unk = true;
    t->dec_byte_fallback = true;
    t->dec_replace_meta = true;
    t->dec_strip_lead = 1;
    char sub[ERR_BUF];
    if ((rc = tok_finish_vocab(t, sub, sizeof sub)) < 0)
        return err_set(err, errlen, rc, "GGUF tokenizer: %s", sub);
    float *scores = malloc(sizeof *scores * (size_t)n_tok);
    if (!scores)
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n_tok; i++) {
        scores[i] = (float)gguf_arr_float(g, "tokenizer.ggml.scores", i);
        if (!isfinite(scores[i])) {
            free(scores);
            return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.scores[%llu] is not a finite number",
                           (unsigned long long)i);
        }
    }
    rc = tok_merges_from_scores(t, scores, sub, sizeof sub);
    free(scores);
    if (rc < 0)
        return err_set(err, errlen, rc, "GGUF tokenizer: %s", sub);

    int64_t unk = -1;
    rc = gguf_get_int(g, "tokenizer.ggml.unknown_token_id", &unk, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    for (uint64_t i = 0; unk < 0 && i < n_tok; i++)
        if (gguf_arr_int(g, "tokenizer.ggml.token_type", i) == 2)
            unk = (int64_t)i;
    if (unk >= t->n_vocab)
        return err_set(err, errlen, ERR_FORMAT, "tokenizer.ggml.unknown_token_id = %lld is outside the vocabulary",
                       (long long)unk);
    t->unk_id = (int32_t)unk;

    bool prefix = true;
    rc = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &prefix, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    if (prefix && (rc = tok_add_norm(t, TOK_NORM_PREPEND, TOK_META, NULL, err, errlen)) < 0)
        return rc;
    if ((rc = tok_add_norm(t, TOK_NORM_REPLACE, " ", TOK_META, err, errlen)) < 0)
        return rc;
    t->dec_strip_lead = prefix ? 1 : 0;
    *add_bos = true;
    return 0;
}

static int load(struct tokenizer *t, const struct gguf_file *g, char *err, size_t errlen)
{
    struct gguf_str model;
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, err, errlen);
    if (rc == ERR_NOT_FOUND)
        return err_set(err, errlen, ERR_NOT_FOUND, "GGUF has no tokenizer.ggml.model");
    if (rc < 0)
        return rc;
    bool add_bos = false, add_eos = false;
    if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0)
        rc = load_gpt2(t, g, &add_bos, err, errlen);
    else if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0)
        rc = load_llama(t, g, &add_bos, err, errlen);
    else
        return err_set(err, errlen, ERR_UNSUPPORTED,
                       "tokenizer.ggml.model \"%.*s\" is not supported (supported: \"gpt2\", byte-level BPE; "
                       "\"llama\", SentencePiece BPE)",
                       (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (rc < 0)
        return rc;
    char sub[ERR_BUF];
    if ((rc = tok_finish(t, sub, sizeof sub)) < 0)
        return err_set(err, errlen, rc, "GGUF tokenizer: %s", sub);

    static const char *const id_keys[2] = { "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id" };
    int32_t *id_out[2] = { &t->bos_id, &t->eos_id };
    for (int k = 0; k < 2; k++) {
        int64_t v;
        rc = gguf_get_int(g, id_keys[k], &v, err, errlen);
        if (rc == ERR_NOT_FOUND)
            continue;
        if (rc < 0)
            return rc;
        if (v < 0 || v >= t->n_vocab)
            return err_set(err, errlen, ERR_FORMAT, "%s = %lld is outside the vocabulary (%d tokens)", id_keys[k],
                           (long long)v, (int)t->n_vocab);
        *id_out[k] = (int32_t)v;
    }
    rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    rc = gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &add_eos, err, errlen);
    if (rc < 0 && rc != ERR_NOT_FOUND)
        return rc;
    tok_set_adds_bos(t, add_bos);
    if (add_eos && t->eos_id >= 0)
        t->suffix[t->n_suffix++] = t->eos_id;
    return 0;
}

int tok_load_gguf(const struct gguf_file *g, struct tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    struct tokenizer *t = tok_new();
    if (!t)
        return err_set(err, errlen, ERR_NOMEM, "out of memory");
    int rc = load(t, g, err, errlen);
    if (rc < 0) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
