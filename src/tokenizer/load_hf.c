/* load_hf.c — builds a struct tokenizer from a Hugging Face tokenizer.json (and applies
 * tokenizer_config.json on request).
 *
 * Supported components (anything else fails at load with ERR_UNSUPPORTED naming it):
 *   normalizer     null, NFC, NFD, NFKC, NFKD, Prepend, Replace (String pattern),
 *                  Sequence of those
 *   pre_tokenizer  null, Sequence, Split (Regex or String pattern, every behavior,
 *                  invert), Digits (individual_digits), Punctuation (behavior),
 *                  ByteLevel (add_prefix_space, use_regex; once), Metaspace (replacement
 *                  U+2581, prepend_scheme or the older add_prefix_space, split)
 *   model          BPE: vocab, merges ("a b" strings or [a, b] pairs), ignore_merges,
 *                  unk_token/fuse_unk, byte_fallback; no dropout or subword affixes.
 *                  With a ByteLevel pre-tokenizer the BPE sees bytes as GPT-2 alphabet
 *                  characters; without one it sees UTF-8 characters (SentencePiece style)
 *   added_tokens   id, content, special, lstrip, rstrip, single_word, normalized
 *   post_processor null, ByteLevel, TemplateProcessing (single: specials around $A),
 *                  RobertaProcessing, BertProcessing, Sequence of those
 *   decoder        ByteLevel (with a ByteLevel pre-tokenizer); else Replace("▁", " "),
 *                  ByteFallback, Fuse, Strip(" ", n, 0) after Fuse, Metaspace, and
 *                  Sequences of those
 * truncation and padding are batch/length options of the Python API and are ignored.
 */
#include "tokenizer/tok_internal.h"

#include "util/err.h"
#include "util/mapfile.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_of(const cJSON *o)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* Optional boolean member: def when absent or null; -1 when of another type. */
static int get_bool(const cJSON *o, const char *key, bool def, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

static bool get_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || floor(d) != d)
        return false;
    *out = (int64_t)d;
    return true;
}

/* ------------------------------------------------------------------ normalizer */

static int load_normalizer(struct tokenizer *t, const cJSON *n, const char *name, char *err, size_t errlen)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    const char *ty = type_of(n);
    if (!ty)
        return err_set(err, errlen, ERR_FORMAT, "%s: normalizer without a type", name);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            return err_set(err, errlen, ERR_FORMAT, "%s: normalizer Sequence without a normalizers array", name);
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            int rc = load_normalizer(t, it, name, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    static const struct {
        const char *name;
        enum tok_norm_kind norm;
    } forms[] = { { "NFC", TOK_NORM_NFC }, { "NFD", TOK_NORM_NFD }, { "NFKC", TOK_NORM_NFKC }, { "NFKD", TOK_NORM_NFKD } };
    char sub[ERR_BUF];
    int rc;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        if (strcmp(ty, forms[i].name) == 0) {
            if ((rc = tok_add_norm(t, forms[i].norm, NULL, NULL, sub, sizeof sub)) < 0)
                return err_set(err, errlen, rc, "%s: %s", name, sub);
            return 0;
        }
    }
    if (strcmp(ty, "Prepend") == 0) {
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(n, "prepend");
        if (!cJSON_IsString(pre))
            return err_set(err, errlen, ERR_FORMAT, "%s: normalizer Prepend without a prepend string", name);
        if ((rc = tok_add_norm(t, TOK_NORM_PREPEND, pre->valuestring, NULL, sub, sizeof sub)) < 0)
            return err_set(err, errlen, rc, "%s: %s", name, sub);
        return 0;
    }
    if (strcmp(ty, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (cJSON_GetObjectItemCaseSensitive(pat, "Regex"))
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: normalizer Replace with a Regex pattern is not supported", name);
        if (!cJSON_IsString(str) || !str->valuestring[0] || !cJSON_IsString(content))
            return err_set(err, errlen, ERR_FORMAT, "%s: normalizer Replace needs pattern {\"String\": ...} and content", name);
        if ((rc = tok_add_norm(t, TOK_NORM_REPLACE, str->valuestring, content->valuestring, sub, sizeof sub)) < 0)
            return err_set(err, errlen, rc, "%s: %s", name, sub);
        return 0;
    }
    return err_set(err, errlen, ERR_UNSUPPORTED,
                   "%s: normalizer %s is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)",
                   name, ty);
}

/* ------------------------------------------------------------------ pre_tokenizer */

static int parse_behavior(const char *s, enum tok_split_behavior *out)
{
    static const struct {
        const char *name;
        enum tok_split_behavior b;
    } names[] = {
        { "Removed", TOK_SPLIT_REMOVED },
        { "Isolated", TOK_SPLIT_ISOLATED },
        { "MergedWithPrevious", TOK_SPLIT_MERGED_PREV },
        { "MergedWithNext", TOK_SPLIT_MERGED_NEXT },
        { "Contiguous", TOK_SPLIT_CONTIGUOUS },
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].b;
            return 0;
        }
    return -1;
}

static int load_pretok(struct tokenizer *t, const cJSON *p, const char *name, bool *byte_level,
                       char *err, size_t errlen)
{
    const char *ty = type_of(p);
    if (!ty)
        return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer without a type", name);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Sequence without a pretokenizers array", name);
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            int rc = load_pretok(t, it, name, byte_level, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        enum tok_split_behavior b;
        bool invert;
        if (!cJSON_IsString(re) && !cJSON_IsString(str))
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Split needs pattern {\"Regex\": ...} or {\"String\": ...}", name);
        if (!cJSON_IsString(beh) || parse_behavior(beh->valuestring, &b) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Split has unknown behavior %s", name,
                           cJSON_IsString(beh) ? beh->valuestring : "(missing)");
        if (get_bool(p, "invert", false, &invert) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Split invert is not a boolean", name);
        const char *s = cJSON_IsString(re) ? re->valuestring : str->valuestring;
        return tok_step_add_split(t, s, strlen(s), !cJSON_IsString(re), b, invert, name, err, errlen);
    }
    if (strcmp(ty, "Digits") == 0) {
        bool individual;
        if (get_bool(p, "individual_digits", false, &individual) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Digits individual_digits is not a boolean", name);
        /* Rust char::is_numeric is general category N; runs merge (Contiguous) unless
         * individual, which is what \p{N}+ / \p{N} with Isolated produce */
        const char *re = individual ? "\\p{N}" : "\\p{N}+";
        return tok_step_add_split(t, re, strlen(re), false, TOK_SPLIT_ISOLATED, false, name, err, errlen);
    }
    if (strcmp(ty, "Punctuation") == 0) {
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        enum tok_split_behavior b = TOK_SPLIT_ISOLATED;
        if (beh && !cJSON_IsNull(beh) && (!cJSON_IsString(beh) || parse_behavior(beh->valuestring, &b) < 0))
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Punctuation has unknown behavior", name);
        return tok_step_add_split(t, tok_punct_regex, strlen(tok_punct_regex), false, b, false, name, err, errlen);
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        bool prefix, use_regex;
        if (*byte_level)
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: two ByteLevel pre-tokenizers are not supported", name);
        if (get_bool(p, "add_prefix_space", true, &prefix) < 0 || get_bool(p, "use_regex", true, &use_regex) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer ByteLevel has a non-boolean option", name);
        int rc = 0;
        if (prefix)
            rc = tok_step_add_prefix_space(t, err, errlen);
        if (rc == 0 && use_regex)
            rc = tok_step_add_split(t, tok_gpt2_regex, strlen(tok_gpt2_regex), false, TOK_SPLIT_ISOLATED,
                                    false, name, err, errlen);
        /* steps after this one see the alphabet; dropped again if none follows */
        if (rc == 0 && !tok_step_add(t, TOK_STEP_BYTELEVEL, err, errlen))
            rc = ERR_UNSUPPORTED;
        *byte_level = true;
        return rc;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(p, "replacement");
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(p, "prepend_scheme");
        bool split, prefix;
        if (!cJSON_IsString(rep) || strcmp(rep->valuestring, TOK_META) != 0)
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: pre_tokenizer Metaspace replacement must be \"\u2581\"",
                           name);
        if (get_bool(p, "split", true, &split) < 0 || get_bool(p, "add_prefix_space", true, &prefix) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Metaspace has a non-boolean option", name);
        /* tokenizers < 0.19 wrote add_prefix_space instead of prepend_scheme */
        enum tok_prepend_scheme ps = prefix ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        if (cJSON_IsString(scheme)) {
            if (strcmp(scheme->valuestring, "always") == 0)
                ps = TOK_PREPEND_ALWAYS;
            else if (strcmp(scheme->valuestring, "first") == 0)
                ps = TOK_PREPEND_FIRST;
            else if (strcmp(scheme->valuestring, "never") == 0)
                ps = TOK_PREPEND_NEVER;
            else
                return err_set(err, errlen, ERR_FORMAT, "%s: pre_tokenizer Metaspace prepend_scheme \"%.32s\" is unknown",
                               name, scheme->valuestring);
        }
        struct tok_step *st = tok_step_add(t, TOK_STEP_METASPACE, err, errlen);
        if (!st)
            return ERR_UNSUPPORTED;
        st->prepend = ps;
        st->meta_split = split;
        return 0;
    }
    return err_set(err, errlen, ERR_UNSUPPORTED,
                   "%s: pre_tokenizer %s is not supported (supported: Sequence, Split, Digits, Punctuation, ByteLevel, "
                   "Metaspace)", name, ty);
}

/* ------------------------------------------------------------------ post_processor */

static int add_affix(struct tokenizer *t, bool prefix, int64_t id, const char *name, char *err, size_t errlen)
{
    int *n = prefix ? &t->n_prefix : &t->n_suffix;
    int32_t *a = prefix ? t->prefix : t->suffix;
    if (*n >= TOK_MAX_AFFIX)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: post_processor adds more than %d tokens", name, TOK_MAX_AFFIX);
    if (id < 0 || id >= t->n_vocab)
        return err_set(err, errlen, ERR_FORMAT, "%s: post_processor token id %lld is not in the vocabulary",
                       name, (long long)id);
    a[(*n)++] = (int32_t)id;
    return 0;
}

static int load_template(struct tokenizer *t, const cJSON *p, const char *name, char *err, size_t errlen)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single))
        return err_set(err, errlen, ERR_FORMAT, "%s: TemplateProcessing without a single template", name);
    bool seen_a = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (seq) {
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(seq, "id");
            if (!cJSON_IsString(sid) || strcmp(sid->valuestring, "A") != 0 || seen_a)
                return err_set(err, errlen, ERR_UNSUPPORTED, "%s: TemplateProcessing single template must hold $A once", name);
            seen_a = true;
            continue;
        }
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsString(tid))
            return err_set(err, errlen, ERR_FORMAT, "%s: TemplateProcessing piece is neither SpecialToken nor Sequence", name);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, tid->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        if (!cJSON_IsArray(ids))
            return err_set(err, errlen, ERR_FORMAT, "%s: TemplateProcessing special token %s has no ids", name,
                           tid->valuestring);
        const cJSON *idv;
        cJSON_ArrayForEach(idv, ids) {
            int64_t id;
            if (!get_int(idv, 0, INT32_MAX, &id))
                return err_set(err, errlen, ERR_FORMAT, "%s: TemplateProcessing special token %s: bad id", name,
                               tid->valuestring);
            int rc = add_affix(t, !seen_a, id, name, err, errlen);
            if (rc < 0)
                return rc;
        }
    }
    if (!seen_a)
        return err_set(err, errlen, ERR_FORMAT, "%s: TemplateProcessing single template lacks $A", name);
    return 0;
}

static int load_post(struct tokenizer *t, const cJSON *p, const char *name, char *err, size_t errlen)
{
    if (!p || cJSON_IsNull(p))
        return 0;
    const char *ty = type_of(p);
    if (!ty)
        return err_set(err, errlen, ERR_FORMAT, "%s: post_processor without a type", name);
    if (strcmp(ty, "ByteLevel") == 0)
        return 0; /* only adjusts offsets */
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        if (!cJSON_IsArray(list))
            return err_set(err, errlen, ERR_FORMAT, "%s: post_processor Sequence without processors", name);
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            int rc = load_post(t, it, name, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "TemplateProcessing") == 0)
        return load_template(t, p, name, err, errlen);
    if (strcmp(ty, "RobertaProcessing") == 0 || strcmp(ty, "BertProcessing") == 0) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        int64_t c, s;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || !get_int(cJSON_GetArrayItem(cls, 1), 0, INT32_MAX, &c) ||
            !get_int(cJSON_GetArrayItem(sep, 1), 0, INT32_MAX, &s))
            return err_set(err, errlen, ERR_FORMAT, "%s: %s needs cls and sep as [token, id]", name, ty);
        int rc = add_affix(t, true, c, name, err, errlen);
        return rc < 0 ? rc : add_affix(t, false, s, name, err, errlen);
    }
    return err_set(err, errlen, ERR_UNSUPPORTED,
                   "%s: post_processor %s is not supported (supported: ByteLevel, TemplateProcessing, "
                   "RobertaProcessing, BertProcessing, Sequence)", name, ty);
}

/* What the decoder chain does, collected while walking it. */
struct dec_info {
    bool byte_level, fused, any;
};

/* Walks the decoder; fills t->dec_* for the character-mode decoders. */
static int load_decoder(struct tokenizer *t, const cJSON *d, const char *name, struct dec_info *di, char *err,
                        size_t errlen)
{
    const char *ty = d && !cJSON_IsNull(d) ? type_of(d) : "null";
    static const char supported[] = "supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence";
    if (!ty)
        return err_set(err, errlen, ERR_FORMAT, "%s: decoder without a type", name);
    di->any = true;
    if (strcmp(ty, "ByteLevel") == 0) {
        di->byte_level = true;
        return 0;
    }
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        const cJSON *it;
        if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) == 0)
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: decoder Sequence without decoders is not supported", name);
        cJSON_ArrayForEach(it, list) {
            int rc = load_decoder(t, it, name, di, err, errlen);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (strcmp(ty, "ByteFallback") == 0) {
        t->dec_byte_fallback = true;
        return 0;
    }
    if (strcmp(ty, "Fuse") == 0) {
        di->fused = true;
        return 0;
    }
    if (strcmp(ty, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d, "pattern"), "String");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(d, "content");
        if (!cJSON_IsString(pat) || !cJSON_IsString(content) || strcmp(pat->valuestring, TOK_META) != 0 ||
            strcmp(content->valuestring, " ") != 0)
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: decoder Replace other than \"\u2581\" -> \" \" is not supported",
                           name);
        t->dec_replace_meta = true;
        return 0;
    }
    if (strcmp(ty, "Strip") == 0) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(d, "content");
        int64_t start = 0, stop = 0;
        if (!cJSON_IsString(content) || strcmp(content->valuestring, " ") != 0 ||
            !get_int(cJSON_GetObjectItemCaseSensitive(d, "start"), 0, 64, &start) ||
            !get_int(cJSON_GetObjectItemCaseSensitive(d, "stop"), 0, 0, &stop) || !di->fused)
            return err_set(err, errlen, ERR_UNSUPPORTED,
                           "%s: decoder Strip is supported only as Strip(\" \", n, 0) after Fuse", name);
        t->dec_strip_lead = (int)start;
        return 0;
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(d, "replacement");
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(d, "prepend_scheme");
        bool prefix;
        if (!cJSON_IsString(rep) || strcmp(rep->valuestring, TOK_META) != 0 ||
            get_bool(d, "add_prefix_space", true, &prefix) < 0)
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: decoder Metaspace replacement must be \"\u2581\"", name);
        t->dec_replace_meta = true;
        t->dec_meta_first = cJSON_IsString(scheme) ? strcmp(scheme->valuestring, "never") != 0 : prefix;
        return 0;
    }
    return err_set(err, errlen, ERR_UNSUPPORTED, "%s: decoder %s is not supported (%s)", name, ty, supported);
}

/* ------------------------------------------------------------------ model + vocab */

static int load_model(struct tokenizer *t, const cJSON *m, const char **unk, const cJSON **merges,
                      const char *name, char *err, size_t errlen)
{
    if (!cJSON_IsObject(m))
        return err_set(err, errlen, ERR_FORMAT, "%s: no model object", name);
    const char *ty = type_of(m);
    if (ty && strcmp(ty, "BPE") != 0)
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: model %s is not supported (only BPE)", name, ty);
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return err_set(err, errlen, ERR_UNSUPPORTED, "%s: BPE dropout is not supported", name);
    bool byte_fallback;
    if (get_bool(m, "byte_fallback", false, &byte_fallback) < 0 || get_bool(m, "ignore_merges", false, &t->ignore_merges) < 0 ||
        get_bool(m, "fuse_unk", false, &t->fuse_unk) < 0)
        return err_set(err, errlen, ERR_FORMAT, "%s: BPE option is not a boolean", name);
    t->byte_fallback = byte_fallback;
    static const char *const affixes[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(m, affixes[i]);
        if (a && !cJSON_IsNull(a) && !(cJSON_IsString(a) && a->valuestring[0] == 0))
            return err_set(err, errlen, ERR_UNSUPPORTED, "%s: BPE %s is not supported", name, affixes[i]);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    *unk = cJSON_IsString(u) ? u->valuestring : NULL;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    if (!cJSON_IsObject(vocab))
        return err_set(err, errlen, ERR_FORMAT, "%s: model.vocab is not an object", name);
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int64_t id;
        if (!get_int(it, 0, (1 << 24) - 1, &id))
            return err_set(err, errlen, ERR_FORMAT, "%s: model.vocab[\"%.64s\"] is not a token id", name, it->string);
        int rc = tok_set_piece(t, (int32_t)id, it->string, strlen(it->string), 0, err, errlen);
        if (rc < 0)
            return rc;
    }
    *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (*merges && !cJSON_IsArray(*merges))
        return err_set(err, errlen, ERR_FORMAT, "%s: model.merges is not an array", name);
    return 0;
}

static int load_added(struct tokenizer *t, const cJSON *list, const char *name, char *err, size_t errlen)
{
    if (!list || cJSON_IsNull(list))
        return 0;
    if (!cJSON_IsArray(list))
        return err_set(err, errlen, ERR_FORMAT, "%s: added_tokens is not an array", name);
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        int64_t id;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!get_int(cJSON_GetObjectItemCaseSensitive(it, "id"), 0, (1 << 24) - 1, &id) || !cJSON_IsString(content))
            return err_set(err, errlen, ERR_FORMAT, "%s: added token without a valid id and content", name);
        bool special, lstrip, rstrip, single, normalized;
        if (get_bool(it, "special", false, &special) < 0 || get_bool(it, "lstrip", false, &lstrip) < 0 ||
            get_bool(it, "rstrip", false, &rstrip) < 0 || get_bool(it, "single_word", false, &single) < 0 ||
            get_bool(it, "normalized", !special, &normalized) < 0)
            return err_set(err, errlen, ERR_FORMAT, "%s: added token %lld has a non-boolean flag", name, (long long)id);
        uint8_t f = TOK_F_ADDED | (special ? TOK_F_SPECIAL : 0) | (lstrip ? TOK_F_LSTRIP : 0) |
                    (rstrip ? TOK_F_RSTRIP : 0) | (single ? TOK_F_SINGLE_WORD : 0) | (normalized ? TOK_F_NORMALIZED : 0);
        int rc = tok_set_piece(t, (int32_t)id, content->valuestring, strlen(content->valuestring), f, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int load_merges(struct tokenizer *t, const cJSON *merges, const char *name, char *err, size_t errlen)
{
    int32_t rank = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring;
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return err_set(err, errlen, ERR_FORMAT, "%s: merge %d \"%.64s\" is not two tokens separated by a space",
                               name, (int)rank, s);
            a = s;
            na = (size_t)(sp - s);
            b = sp + 1;
            nb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else {
            return err_set(err, errlen, ERR_FORMAT, "%s: merge %d is neither \"a b\" nor [a, b]", name, (int)rank);
        }
        char sub[ERR_BUF];
        int rc = tok_add_merge(t, a, na, b, nb, rank, sub, sizeof sub);
        if (rc < 0)
            return err_set(err, errlen, rc, "%s: %s", name, sub);
        rank++;
    }
    return 0;
}

static int load_root(struct tokenizer *t, const cJSON *root, const char *name, char *err, size_t errlen)
{
    if (!cJSON_IsObject(root))
        return err_set(err, errlen, ERR_FORMAT, "%s: not a JSON object", name);
    const char *unk = NULL;
    const cJSON *merges = NULL;
    char sub[ERR_BUF];
    int rc = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), &unk, &merges, name, err, errlen);
    if (rc == 0)
        rc = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), name, err, errlen);
    /* the pre-tokenizer says whether the BPE sees bytes (ByteLevel) or characters, which
     * the vocabulary tables depend on */
    bool byte_level = false;
    if (rc == 0) {
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
        if (pre && !cJSON_IsNull(pre))
            rc = load_pretok(t, pre, name, &byte_level, err, errlen);
        if (t->n_steps > 0 && t->steps[t->n_steps - 1].kind == TOK_STEP_BYTELEVEL)
            t->n_steps--; /* nothing after ByteLevel: the BPE maps the bytes itself */
        t->byte_level = byte_level;
    }
    if (rc == 0) {
        struct dec_info di = { 0 };
        rc = load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), name, &di, err, errlen);
        if (rc == 0 && di.byte_level != byte_level)
            rc = err_set(err, errlen, ERR_UNSUPPORTED,
                         "%s: a ByteLevel %s without a ByteLevel %s is not supported", name,
                         byte_level ? "pre_tokenizer" : "decoder", byte_level ? "decoder" : "pre_tokenizer");
        if (rc == 0 && byte_level && (t->dec_byte_fallback || t->dec_replace_meta || t->dec_strip_lead))
            rc = err_set(err, errlen, ERR_UNSUPPORTED, "%s: decoder ByteLevel mixed with SentencePiece decoders", name);
    }
    if (rc == 0 && (rc = tok_finish_vocab(t, sub, sizeof sub)) < 0)
        err_set(err, errlen, rc, "%s: %s", name, sub);
    if (rc == 0 && merges)
        rc = load_merges(t, merges, name, err, errlen);
    if (rc == 0)
        rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), name, err, errlen);
    if (rc == 0)
        rc = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), name, err, errlen);
    if (rc == 0 && (rc = tok_finish(t, sub, sizeof sub)) < 0)
        err_set(err, errlen, rc, "%s: %s", name, sub);
    if (rc == 0 && unk) {
        t->unk_id = tok_vocab_lookup(t, unk, strlen(unk));
        if (t->unk_id < 0)
            rc = err_set(err, errlen, ERR_FORMAT, "%s: unk_token \"%.64s\" is not in the vocabulary", name, unk);
    }
    if (rc == 0 && t->n_prefix > 0)
        t->bos_id = t->prefix[0];
    /* No BOS in the post-processor (DeepSeek, Qwen): remember a special token with a
     * well-known BOS name, so tok_set_adds_bos(true) from tokenizer_config works */
    static const char *const bos_names[] = { "<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<s>", "<bos>",
                                             "<|startoftext|>" };
    for (size_t i = 0; rc == 0 && t->bos_id < 0 && i < sizeof bos_names / sizeof bos_names[0]; i++) {
        int32_t id = tok_vocab_lookup(t, bos_names[i], strlen(bos_names[i]));
        if (id >= 0 && (t->flags[id] & TOK_F_SPECIAL))
            t->bos_id = id;
    }
    return rc;
}

static int load_buf(const char *json, size_t len, const char *name, struct tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root)
        return err_set(err, errlen, ERR_FORMAT, "%s: invalid JSON", name);
    struct tokenizer *t = tok_new();
    int rc = t ? load_root(t, root, name, err, errlen) : err_set(err, errlen, ERR_NOMEM, "%s: out of memory", name);
    cJSON_Delete(root);
    if (rc < 0) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int tok_load_hf_json_buf(const char *json, size_t len, struct tokenizer **out, char *err, size_t errlen)
{
    return load_buf(json, len, "tokenizer.json", out, err, errlen);
}

int tok_load_hf_json(const char *path, struct tokenizer **out, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = read_text_file(path, &text, &len, err, errlen);
    if (rc < 0)
        return rc;
    rc = load_buf(text, len, path, out, err, errlen);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------ tokenizer_config.json */

/* bos_token / eos_token: a string or {"content": ...}; absent or null -> -2 (leave). */
static int config_token(const struct tokenizer *t, const cJSON *root, const char *key, const char *name,
                        int32_t *id, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        *id = -2;
        return 0;
    }
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v))
        return err_set(err, errlen, ERR_FORMAT, "%s: %s is neither a string nor an AddedToken", name, key);
    *id = tok_vocab_lookup(t, v->valuestring, strlen(v->valuestring));
    if (*id < 0)
        return err_set(err, errlen, ERR_FORMAT, "%s: %s \"%.64s\" is not in the vocabulary", name, key, v->valuestring);
    return 0;
}

int tok_apply_hf_config(struct tokenizer *t, const char *path, char *err, size_t errlen)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_text_file(path, &text, &len, err, errlen);
    if (rc < 0)
        return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(err, errlen, ERR_FORMAT, "%s: invalid JSON", path);
    }
    int32_t bos, eos;
    bool add_bos = false, add_eos = false;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(root, "add_eos_token");
    rc = config_token(t, root, "bos_token", path, &bos, err, errlen);
    if (rc == 0)
        rc = config_token(t, root, "eos_token", path, &eos, err, errlen);
    if (rc == 0 && (get_bool(root, "add_bos_token", false, &add_bos) < 0 || get_bool(root, "add_eos_token", false, &add_eos) < 0))
        rc = err_set(err, errlen, ERR_FORMAT, "%s: add_bos_token/add_eos_token is not a boolean", path);
    if (rc == 0) {
        if (bos != -2)
            t->bos_id = bos;
        if (eos != -2)
            t->eos_id = eos;
        /* transformers rebuilds the post-processor from add_bos_token/add_eos_token when
         * the config sets them; otherwise tokenizer.json's post-processor stands */
        if (cJSON_IsBool(ab)) {
            t->n_prefix = 0;
            tok_set_adds_bos(t, add_bos);
        }
        if (cJSON_IsBool(ae)) {
            t->n_suffix = 0;
            if (add_eos && t->eos_id >= 0)
                t->suffix[t->n_suffix++] = t->eos_id;
        }
    }
    cJSON_Delete(root);
    return rc;
}

int tok_load_hf_dir(const char *dir, struct tokenizer **out, char *err, size_t errlen)
{
    char path[4096];
    *out = NULL;
    if (snprintf(path, sizeof path, "%s/tokenizer.json", dir) >= (int)sizeof path)
        return err_set(err, errlen, ERR_INVALID, "%s: path too long", dir);
    int rc = tok_load_hf_json(path, out, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0; /* optional */
    fclose(f);
    rc = tok_apply_hf_config(*out, path, err, errlen);
    if (rc < 0) {
        tok_free(*out);
        *out = NULL;
    }
    return rc;
}
