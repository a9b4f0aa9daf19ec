/* openai.c — request bodies of /v1/chat/completions and /v1/completions → struct
 * oai_request (see openai.h), plus the helpers the other openai*.c files share: the JSON
 * body parser with its UTF-8 check, the model check and prompt tokenization.
 *
 * Invariants: a parse either returns 0 with every field of *out valid for engine_submit
 * (ranges checked here with the same bounds the sampler and stop matcher use, so the
 * engine never rejects what we accepted for a reason the client could have been told
 * about), or returns a negative code with *out empty and *e filled. JSON null counts as
 * "absent" for every optional parameter, as in OpenAI's and vLLM's schemas. No globals;
 * any thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/openai.h"
#include "api/openai_internal.h"
#include "chat/chat.h"
#include "engine/block_manager.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"
#include "util/grow.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---------------------------------------------------------------- errors */

int oai_bad(struct api_error *e, const char *param, const char *fmt, ...)
{
    char msg[sizeof e->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error_set(e, 400, API_ERR_INVALID_REQUEST, param, NULL, "%s", msg);
    return ERR_INVALID;
}

int oai_nomem(struct api_error *e)
{
    api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
    return ERR_NOMEM;
}

/* ---------------------------------------------------------------- UTF-8 */

int oai_utf8_seq_len(const unsigned char *s, size_t len)
{
    if (len == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int n;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) { n = 2; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { n = 3; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; min = 0x10000; }
    else return 0; /* continuation byte, overlong 2-byte lead (c0/c1) or > U+10FFFF */
    if (len < (size_t)n) return 0;
    unsigned cp = c & (0xff >> (n + 1));
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

bool oai_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int n = oai_utf8_seq_len(p + i, len - i);
        if (!n) return false;
        i += (size_t)n;
    }
    return true;
}

size_t oai_utf8_chars(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, chars = 0;
    while (i < len) {
        int n = oai_utf8_seq_len(p + i, len - i);
        i += n ? (size_t)n : 1; /* an invalid byte is sent as one U+FFFD */
        chars++;
    }
    return chars;
}

/* ---------------------------------------------------------------- body */

/* cJSON turns the escape \u0000 into a NUL that silently cuts the string short, and
 * copies raw NUL bytes the same way; both are refused before parsing. Scans strings
 * lexically (a backslash escapes the next byte). Returns true if body is free of both. */
static bool body_nul_free(const char *body, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (c == '\0') return false;
        if (!in_str) {
            if (c == '"') in_str = true;
        } else if (c == '\\') {
            if (i + 5 < len && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4)) return false;
            i++;
        } else if (c == '"') {
            in_str = false;
        }
    }
    return true;
}

/* Checks every key and string below item; path is item's parameter path. */
static int check_utf8_tree(const cJSON *item, char *path, size_t cap, struct api_error *e)
{
    if (cJSON_IsString(item) && !oai_utf8_valid(item->valuestring, strlen(item->valuestring)))
        return oai_bad(e, path, "'%s' is not valid UTF-8", path[0] ? path : "body");
    if (!cJSON_IsArray(item) && !cJSON_IsObject(item)) return 0;
    size_t base = strlen(path);
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, item) {
        if (cJSON_IsObject(item)) {
            if (!oai_utf8_valid(c->string, strlen(c->string)))
                return oai_bad(e, path[0] ? path : NULL, "a key in '%s' is not valid UTF-8",
                           path[0] ? path : "body");
            snprintf(path + base, cap - base, "%s%s", base ? "." : "", c->string);
        } else {
            snprintf(path + base, cap - base, "[%d]", i);
        }
        int rc = check_utf8_tree(c, path, cap, e);
        if (rc) return rc;
        path[base] = 0;
        i++;
    }
    return 0;
}

cJSON *oai_parse_body(const char *body, size_t len, struct api_error *e)
{
    if (!body_nul_free(body, len)) {
        oai_bad(e, NULL, "the request body contains a NUL character (raw or \\u0000), which is not supported");
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        oai_bad(e, NULL, "the request body is not valid JSON (error near byte %zu)", at);
        return NULL;
    }
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (end != body + len) {
        cJSON_Delete(root);
        oai_bad(e, NULL, "the request body is not valid JSON (unexpected data after the value at byte %zu)",
            (size_t)(end - body));
        return NULL;
    }
    char path[256] = "";
    if (check_utf8_tree(root, path, sizeof path, e)) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* ---------------------------------------------------------------- fields */

const cJSON *oai_opt(const cJSON *obj, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

/* Optional number in [lo, hi] (lo excluded when lo_open). Sets *v and returns 1 if given,
 * 0 if absent, or a negative code. */
static int opt_num(const cJSON *obj, const char *key, double lo, bool lo_open, double hi,
                   double *v, struct api_error *e)
{
    const cJSON *it = oai_opt(obj, key);
    if (!it) return 0;
    if (!cJSON_IsNumber(it)) return oai_bad(e, key, "'%s' must be a number", key);
    double d = it->valuedouble;
    if (!(lo_open ? d > lo : d >= lo) || !(d <= hi))
        return oai_bad(e, key, "'%s' must be %s %g and <= %g, got %g", key, lo_open ? ">" : ">=", lo, hi, d);
    *v = d;
    return 1;
}

/* Optional integer (a JSON number without a fraction) in [lo, hi]; range, when not NULL,
 * replaces the "between lo and hi" wording of the error. */
static int opt_int_msg(const cJSON *obj, const char *key, double lo, double hi, const char *range,
                       double *v, struct api_error *e)
{
    const cJSON *it = oai_opt(obj, key);
    if (!it) return 0;
    double d = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!cJSON_IsNumber(it) || !isfinite(d) || d != floor(d))
        return oai_bad(e, key, "'%s' must be an integer", key);
    if (d < lo || d > hi) {
        if (range) return oai_bad(e, key, "'%s' must be %s, got %.0f", key, range, d);
        return oai_bad(e, key, "'%s' must be between %.0f and %.0f, got %.0f", key, lo, hi, d);
    }
    *v = d;
    return 1;
}

static int opt_int(const cJSON *obj, const char *key, double lo, double hi, double *v,
                   struct api_error *e)
{
    return opt_int_msg(obj, key, lo, hi, NULL, v, e);
}

static int opt_bool(const cJSON *obj, const char *key, bool *v, struct api_error *e)
{
    const cJSON *it = oai_opt(obj, key);
    if (!it) return 0;
    if (!cJSON_IsBool(it)) return oai_bad(e, key, "'%s' must be a boolean", key);
    *v = cJSON_IsTrue(it);
    return 1;
}

static int opt_str(const cJSON *obj, const char *key, const char **v, struct api_error *e)
{
    const cJSON *it = oai_opt(obj, key);
    if (!it) return 0;
    if (!cJSON_IsString(it)) return oai_bad(e, key, "'%s' must be a string", key);
    *v = it->valuestring;
    return 1;
}

#define TRY(x)                      \
    do {                            \
        if ((rc = (x)) < 0) goto fail; \
    } while (0)

int oai_check_model(const struct oai_ctx *ctx, const cJSON *root, const char **name,
                    struct api_error *e)
{
    const char *want = NULL;
    int rc = opt_str(root, "model", &want, e);
    if (rc < 0) return rc;
    if (!rc) {
        *name = ctx->n_served > 0 ? ctx->served_names[0] : "";
        return 0;
    }
    for (int i = 0; i < ctx->n_served; i++)
        if (!strcmp(want, ctx->served_names[i])) {
            *name = ctx->served_names[i];
            return 0;
        }
    api_error_set(e, 404, API_ERR_INVALID_REQUEST, "model", "model_not_found",
                  "The model '%.200s' does not exist.", want);
    return ERR_NOT_FOUND;
}

static uint64_t random_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        /* no entropy source: still different per call and thread */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&s;
    }
    return s;
}

/* --max-logprobs: asking for more alternatives per token than the server allows is a 400
 * (vLLM's rule). The error, for a v above ctx->max_logprobs. */
static int logprobs_cap_error(const struct oai_ctx *ctx, const char *key, double v, struct api_error *e)
{
    return oai_bad(e, key, "'%s' asks for %.0f log probabilities per token; this server allows at most %d "
                   "(--max-logprobs)", key, v, ctx->max_logprobs);
}

/* Sampling parameters, each from the body or ctx->defaults. */
static int parse_sampling(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                          struct api_error *e)
{
    struct sampler_params *sp = &r->rp.sp;
    double v;
    int rc;
    *sp = ctx->defaults.sp;
    TRY(opt_num(root, "temperature", 0, false, 2, &v, e));
    if (rc) sp->temperature = (float)v;
    TRY(opt_num(root, "top_p", 0, true, 1, &v, e));
    if (rc) sp->top_p = (float)v;
    TRY(opt_num(root, "min_p", 0, false, 1, &v, e));
    if (rc) sp->min_p = (float)v;
    TRY(opt_num(root, "presence_penalty", -2, false, 2, &v, e));
    if (rc) sp->presence_penalty = (float)v;
    TRY(opt_num(root, "frequency_penalty", -2, false, 2, &v, e));
    if (rc) sp->frequency_penalty = (float)v;
    TRY(opt_num(root, "repetition_penalty", 0, true, 2, &v, e));
    if (rc) sp->repetition_penalty = (float)v;
    TRY(opt_int_msg(root, "top_k", -1, INT_MAX, "-1 (off) or a non-negative integer", &v, e));
    if (rc) sp->top_k = (int)v; /* -1 and 0 both mean off */
    /* any 64-bit seed: negative values wrap as in a C cast (JSON numbers beyond 2^53
     * are already rounded by the parser) */
    TRY(opt_int_msg(root, "seed", -9223372036854775808.0, 18446744073709549568.0, "a 64-bit integer", &v, e));
    r->seed_given = rc == 1;
    sp->seed = !rc ? random_seed() : v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    char err[ERR_BUF];
    if (sampler_params_validate(sp, err, sizeof err)) {
        /* only a bad server default can get here: name it */
        char param[64];
        snprintf(param, sizeof param, "%.*s", (int)strcspn(err, ":"), err);
        return oai_bad(e, param, "%s", err);
    }
    return 0;
fail:
    return rc;
}

/* stop: a string or an array of up to STOP_MAX_STRINGS non-empty strings. */
static int parse_stop(const cJSON *root, struct oai_request *r, struct api_error *e)
{
    const cJSON *it = oai_opt(root, "stop");
    if (!it) return 0;
    const char *strs[STOP_MAX_STRINGS];
    int n = 0;
    if (cJSON_IsString(it)) {
        strs[n++] = it->valuestring;
    } else if (cJSON_IsArray(it)) {
        int size = cJSON_GetArraySize(it);
        if (size > STOP_MAX_STRINGS)
            return oai_bad(e, "stop", "'stop' may hold at most %d strings, got %d", STOP_MAX_STRINGS, size);
        const cJSON *s;
        cJSON_ArrayForEach(s, it) {
            if (!cJSON_IsString(s)) return oai_bad(e, "stop", "'stop' must be a string or an array of strings");
            strs[n++] = s->valuestring;
        }
    } else {
        return oai_bad(e, "stop", "'stop' must be a string or an array of strings");
    }
    char err[ERR_BUF];
    for (int i = 0; i < n; i++)
        if (!strs[i][0]) return oai_bad(e, "stop", "'stop' strings must not be empty");
    if (stop_validate(strs, n, err, sizeof err)) return oai_bad(e, "stop", "'stop': %s", err);
    for (int i = 0; i < n; i++) {
        if (!(r->stop_strs[i] = strdup(strs[i]))) {
            api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
            return ERR_NOMEM;
        }
        r->rp.stops[i] = r->stop_strs[i];
        r->rp.n_stops = i + 1;
    }
    return 0;
}

/* A vLLM list of token ids (stop_token_ids, allowed_token_ids): an array of at most max
 * ids in the vocabulary, in *ids (malloc'd) and *n; absent, null or [] → NULL and 0. */
static int parse_token_ids(const struct oai_ctx *ctx, const cJSON *root, const char *key, int max, int32_t **ids,
                           int *n, struct api_error *e)
{
    *ids = NULL;
    *n = 0;
    const cJSON *it = oai_opt(root, key);
    if (!it) return 0;
    if (!cJSON_IsArray(it)) return oai_bad(e, key, "'%s' must be an array of token ids", key);
    int len = cJSON_GetArraySize(it), vocab = ctx->m->cfg.vocab_size, i = 0;
    if (len == 0) return 0;
    if (len > max) return oai_bad(e, key, "'%s' may hold at most %d ids, got %d", key, max, len);
    int32_t *v = malloc(sizeof *v * (size_t)len);
    if (!v) return oai_nomem(e);
    const cJSON *t;
    cJSON_ArrayForEach(t, it) {
        double d = cJSON_IsNumber(t) ? t->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < 0 || d >= vocab) {
            free(v);
            return oai_bad(e, key, "'%s'[%d] is not a token id in [0, %d)", key, i, vocab);
        }
        v[i++] = (int32_t)d;
    }
    *ids = v;
    *n = len;
    return 0;
}

/* stop_token_ids and allowed_token_ids (vLLM). */
static int parse_token_id_lists(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                                struct api_error *e)
{
    int32_t *stop;
    int n, rc = parse_token_ids(ctx, root, "stop_token_ids", SCHED_MAX_STOP_IDS, &stop, &n, e);
    if (rc) return rc;
    if (n) memcpy(r->rp.stop_ids, stop, sizeof *stop * (size_t)n);
    r->rp.n_stop_ids = n;
    free(stop);
    if ((rc = parse_token_ids(ctx, root, "allowed_token_ids", ctx->m->cfg.vocab_size, &r->allowed_ids,
                              &r->rp.n_allowed, e)))
        return rc;
    r->rp.allowed_ids = r->allowed_ids;
    return 0;
}

/* Appends a bad word's tokens (its length, then its ids) to r->bad_words; false on OOM. */
static bool add_bad_word(struct oai_request *r, int *cap, const int32_t *ids, int n)
{
    size_t c = (size_t)*cap;
    if (!grow_array((void **)&r->bad_words, &c, (size_t)(r->rp.bad_words_len + 1 + n), sizeof *r->bad_words))
        return false;
    *cap = (int)c;
    r->bad_words[r->rp.bad_words_len++] = n;
    memcpy(r->bad_words + r->rp.bad_words_len, ids, sizeof *ids * (size_t)n);
    r->rp.bad_words_len += n;
    return true;
}

/* bad_words (vLLM): strings that must not be generated. Each word (leading white space
 * dropped) is banned as the model's tokenizer writes it at the start of a text, and, when
 * that differs as a word of its own, after a space (the same number of tokens, another
 * first one), as vLLM does. */
static int parse_bad_words(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                           struct api_error *e)
{
    const cJSON *it = oai_opt(root, "bad_words");
    if (!it) return 0;
    if (!cJSON_IsArray(it)) return oai_bad(e, "bad_words", "'bad_words' must be an array of strings");
    int n = cJSON_GetArraySize(it), cap = 0, k = 0;
    if (n > SCHED_MAX_BAD_WORDS / 2)
        return oai_bad(e, "bad_words", "'bad_words' may hold at most %d words, got %d", SCHED_MAX_BAD_WORDS / 2, n);
    const cJSON *w;
    cJSON_ArrayForEach(w, it) {
        const char *t = cJSON_IsString(w) ? w->valuestring : NULL;
        while (t && isspace((unsigned char)*t)) t++; /* Python's lstrip() */
        if (!t || !*t) return oai_bad(e, "bad_words", "'bad_words'[%d] must be a non-empty string", k);
        size_t len = strlen(t);
        char *spaced = malloc(len + 2);
        if (!spaced) return oai_nomem(e);
        spaced[0] = ' ';
        memcpy(spaced + 1, t, len + 1);
        int32_t a[SCHED_MAX_BAD_WORD_TOKENS], b[SCHED_MAX_BAD_WORD_TOKENS];
        int na = tok_encode(ctx->m->tok, t, len, false, false, a, SCHED_MAX_BAD_WORD_TOKENS);
        int nb = tok_encode(ctx->m->tok, spaced, len + 1, false, false, b, SCHED_MAX_BAD_WORD_TOKENS);
        free(spaced);
        if (na < 1 || nb < 1 || na > SCHED_MAX_BAD_WORD_TOKENS || nb > SCHED_MAX_BAD_WORD_TOKENS)
            return oai_bad(e, "bad_words", "'bad_words'[%d] must be 1 to %d tokens long", k, SCHED_MAX_BAD_WORD_TOKENS);
        if (!add_bad_word(r, &cap, a, na) || (nb == na && b[0] != a[0] && !add_bad_word(r, &cap, b, nb)))
            return oai_nomem(e);
        k++;
    }
    r->rp.bad_words = r->bad_words;
    return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...}, ids in the vocabulary. */
static int parse_logit_bias(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                            struct api_error *e)
{
    const cJSON *it = oai_opt(root, "logit_bias");
    if (!it) return 0;
    if (!cJSON_IsObject(it))
        return oai_bad(e, "logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
    int n = cJSON_GetArraySize(it);
    if (n > SAMPLER_MAX_LOGIT_BIAS)
        return oai_bad(e, "logit_bias", "'logit_bias' may hold at most %d entries, got %d", SAMPLER_MAX_LOGIT_BIAS, n);
    if (n == 0) return 0;
    r->bias_ids = malloc(sizeof *r->bias_ids * (size_t)n);
    r->bias_vals = malloc(sizeof *r->bias_vals * (size_t)n);
    if (!r->bias_ids || !r->bias_vals) {
        api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
        return ERR_NOMEM;
    }
    int vocab = ctx->m->cfg.vocab_size, i = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, it) {
        const char *k = b->string;
        size_t kl = strlen(k);
        long id = -1;
        if (kl > 0 && kl <= 10 && strspn(k, "0123456789") == kl) id = strtol(k, NULL, 10);
        if (id < 0 || id >= vocab)
            return oai_bad(e, "logit_bias", "'logit_bias' key '%.64s' is not a token id in [0, %d)", k, vocab);
        if (!cJSON_IsNumber(b))
            return oai_bad(e, "logit_bias", "'logit_bias' value for token %ld must be a number", id);
        double d = b->valuedouble;
        if (!(d >= -100 && d <= 100))
            return oai_bad(e, "logit_bias", "'logit_bias' value for token %ld must be in [-100, 100], got %g", id, d);
        r->bias_ids[i] = (int32_t)id;
        r->bias_vals[i] = (float)d;
        i++;
    }
    r->rp.bias_ids = r->bias_ids;
    r->rp.bias = r->bias_vals;
    r->rp.n_bias = n;
    return 0;
}

/* ---------------------------------------------------------------- not implemented */

/* Parameters of OpenAI's and vLLM's APIs that this server knows but does not implement.
 * A request that sets one to a value it depends on is refused (400 naming it) rather than
 * answered as if it had been honoured; the neutral values are accepted. */
enum unsup_when { UNSUP_NOT_NULL, UNSUP_TRUE, UNSUP_NONEMPTY };
static const struct {
    const char *name;
    enum unsup_when when;
    bool chat_only;
    const char *why;
} UNSUPPORTED[] = {
    { "logits_processors", UNSUP_NONEMPTY, false, "logits processors are not implemented" },
    { "use_beam_search", UNSUP_TRUE, false, "beam search is not implemented" },
    { "echo", UNSUP_TRUE, true, "echoing the prompt is not supported" },
    { "functions", UNSUP_NONEMPTY, true, "function calling is not implemented" },
    { "audio", UNSUP_NOT_NULL, true, "audio output is not supported (text-only server)" },
    { "web_search_options", UNSUP_NOT_NULL, true, "web search is not supported" },
    { "chat_template", UNSUP_NOT_NULL, true,
      "a request's own chat template is not accepted (as vLLM without "
      "--trust-request-chat-template); start the server with --chat-template FILE" },
    { "structural_tag", UNSUP_NOT_NULL, false,
      "structural tags are not implemented; use response_format, guided_json or tools" },
    { "guided_whitespace_pattern", UNSUP_NOT_NULL, false,
      "the JSON grammar's white space cannot be changed" },
    { "return_tokens_as_token_ids", UNSUP_TRUE, false,
      "logprobs name tokens by their text (and bytes), not as 'token_id:N'" },
    { "reasoning_effort", UNSUP_NOT_NULL, true,
      "it is not implemented; pass it in 'chat_template_kwargs' if the model's template reads it" },
};

static bool unsup_applies(const cJSON *it, enum unsup_when when)
{
    switch (when) {
    case UNSUP_NOT_NULL: return true;
    case UNSUP_TRUE: return !cJSON_IsFalse(it);
    case UNSUP_NONEMPTY:
        if (cJSON_IsNumber(it)) return it->valuedouble != 0;
        if (cJSON_IsArray(it) || cJSON_IsObject(it)) return cJSON_GetArraySize(it) > 0;
        if (cJSON_IsString(it)) return it->valuestring[0] != 0;
        return !cJSON_IsFalse(it);
    }
    return true;
}

static int check_unsupported(const cJSON *root, enum oai_kind kind, struct api_error *e)
{
    for (size_t i = 0; i < sizeof UNSUPPORTED / sizeof *UNSUPPORTED; i++) {
        if (UNSUPPORTED[i].chat_only && kind != OAI_CHAT) continue;
        const cJSON *it = oai_opt(root, UNSUPPORTED[i].name);
        if (it && unsup_applies(it, UNSUPPORTED[i].when))
            return oai_bad(e, UNSUPPORTED[i].name, "'%s' is not supported: %s", UNSUPPORTED[i].name,
                       UNSUPPORTED[i].why);
    }
    if (kind != OAI_CHAT) return 0;
    const cJSON *fc = oai_opt(root, "function_call");
    if (fc && !(cJSON_IsString(fc) && (!strcmp(fc->valuestring, "none") ||
                                       !strcmp(fc->valuestring, "auto"))))
        return oai_bad(e, "function_call", "'function_call' is not supported: use 'tools' and 'tool_choice'");
    const cJSON *mod = oai_opt(root, "modalities");
    if (mod) {
        const cJSON *m0 = cJSON_IsArray(mod) ? cJSON_GetArrayItem(mod, 0) : NULL;
        bool text_only = cJSON_IsArray(mod) && cJSON_GetArraySize(mod) == 1 && cJSON_IsString(m0) &&
                         !strcmp(m0->valuestring, "text");
        if (!text_only)
            return oai_bad(e, "modalities", "'modalities' other than [\"text\"] are not supported");
    }
    return 0;
}

/* Everything but the prompt / messages and the context check. */
static int parse_options(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                         int64_t *max_req, const char **max_key, struct api_error *e)
{
    double v;
    bool bv;
    const char *s;
    int rc;
    TRY(oai_check_model(ctx, root, &r->model, e));
    TRY(check_unsupported(root, r->kind, e));
    TRY(parse_sampling(ctx, root, r, e));

    TRY(opt_bool(root, "stream", &r->stream, e));
    const cJSON *so = oai_opt(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) { rc = oai_bad(e, "stream_options", "'stream_options' must be an object"); goto fail; }
        if (!r->stream) {
            rc = oai_bad(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto fail;
        }
        if ((rc = opt_bool(so, "include_usage", &r->include_usage, e)) < 0) {
            oai_bad(e, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
            goto fail;
        }
        if ((rc = opt_bool(so, "continuous_usage_stats", &r->continuous_usage, e)) < 0) {
            oai_bad(e, "stream_options.continuous_usage_stats",
                    "'stream_options.continuous_usage_stats' must be a boolean");
            goto fail;
        }
        r->continuous_usage = r->continuous_usage && r->include_usage; /* as vLLM reads it */
    }

    TRY(opt_int(root, "n", 1, OAI_MAX_N, &v, e));
    if (rc) r->n = (int)v;
    /* truncate_prompt_tokens (vLLM): keep each prompt's last k tokens; -1: max_model_len */
    TRY(opt_int_msg(root, "truncate_prompt_tokens", -1, 1e300, "-1 or at least 1", &v, e));
    if (rc) {
        if (v == 0 || v > ctx->max_model_len) {
            rc = oai_bad(e, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or 1 to max_model_len (%d)",
                         ctx->max_model_len);
            goto fail;
        }
        r->truncate = v < 0 ? ctx->max_model_len : (int)v;
    }

    /* chat: max_completion_tokens replaces the deprecated max_tokens */
    *max_key = "max_tokens";
    *max_req = 0;
    const char *keys[2] = { "max_completion_tokens", "max_tokens" };
    for (int i = r->kind == OAI_CHAT ? 0 : 1; i < 2 && !*max_req; i++) {
        /* completions: 0 with echo scores the prompt (checked with echo below) */
        TRY(opt_int_msg(root, keys[i], r->kind == OAI_COMPLETION ? 0 : 1, 1e300,
                        r->kind == OAI_COMPLETION ? "at least 0" : "at least 1", &v, e));
        if (!rc) continue;
        if (v == 0) {
            r->echo_only = true;
            v = 1;
        }
        /* beyond any context (caught by the caller's context check) */
        *max_req = v > (double)INT64_MAX / 2 ? INT64_MAX / 2 : (int64_t)v;
        r->rp.max_tokens = v > INT_MAX ? INT_MAX : (int)v;
        *max_key = keys[i];
    }
    if (!*max_req) r->rp.max_tokens = ctx->defaults.max_tokens > 0 ? ctx->defaults.max_tokens : 0;
    TRY(opt_int(root, "min_tokens", 0, INT_MAX, &v, e));
    if (rc) {
        if (*max_req && v > (double)*max_req) {
            rc = oai_bad(e, "min_tokens", "'min_tokens' (%.0f) must not be greater than '%s' (%lld)", v, *max_key,
                         (long long)*max_req);
            goto fail;
        }
        r->rp.min_tokens = (int)v;
    }

    TRY(parse_stop(root, r, e));
    TRY(parse_logit_bias(ctx, root, r, e));

    if (r->kind == OAI_CHAT) {
        bool lp = false;
        TRY(opt_bool(root, "logprobs", &lp, e));
        TRY(opt_int(root, "top_logprobs", 0, SAMPLER_MAX_TOP_LOGPROBS, &v, e));
        if (rc && !lp) {
            rc = oai_bad(e, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
            goto fail;
        }
        if (rc && v > ctx->max_logprobs) {
            rc = logprobs_cap_error(ctx, "top_logprobs", v, e);
            goto fail;
        }
        r->top_logprobs = lp ? (rc ? (int)v : 0) : -1;
    } else {
        const cJSON *lp = oai_opt(root, "logprobs");
        if (lp && cJSON_IsBool(lp)) {
            rc = oai_bad(e, "logprobs", "'logprobs' must be an integer (0..5) for completions");
            goto fail;
        }
        TRY(opt_int(root, "logprobs", 0, 5, &v, e));
        r->top_logprobs = rc ? (int)v : -1;
        if (rc && v > ctx->max_logprobs) {
            rc = logprobs_cap_error(ctx, "logprobs", v, e);
            goto fail;
        }
        bv = false;
        TRY(opt_bool(root, "echo", &bv, e));
        if (r->echo_only && !bv) {
            rc = oai_bad(e, "max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': the prompt "
                         "alone, e.g. to score it with 'logprobs')");
            goto fail;
        }
        r->echo_on = bv;
        /* echo with logprobs: the prompt's tokens are listed first, with their logprobs */
        if (bv && r->top_logprobs >= 0) r->rp.prompt_logprobs = r->top_logprobs;
        TRY(opt_str(root, "suffix", &s, e));
        if (rc && s[0]) { rc = oai_bad(e, "suffix", "'suffix' is not supported"); goto fail; }
    }
    r->rp.logprobs = r->top_logprobs;
    /* vLLM's prompt_logprobs: each prompt token's logprob, rank and k alternatives; like
       vLLM, not with stream */
    TRY(opt_int(root, "prompt_logprobs", 0, SAMPLER_MAX_TOP_LOGPROBS, &v, e));
    if (rc) {
        if (r->stream) {
            rc = oai_bad(e, "prompt_logprobs", "'prompt_logprobs' is not available with 'stream'");
            goto fail;
        }
        if (v > ctx->max_logprobs) {
            rc = logprobs_cap_error(ctx, "prompt_logprobs", v, e);
            goto fail;
        }
        r->prompt_logprobs = (int)v;
        if (r->rp.prompt_logprobs < (int)v) r->rp.prompt_logprobs = (int)v;
    }
    TRY(opt_int_msg(root, "best_of", 1, INT_MAX, "at least 1", &v, e)); /* vLLM takes it on both */
    if (rc && v > 1) { rc = oai_bad(e, "best_of", "'best_of' > 1 is not supported"); goto fail; }

    TRY(opt_bool(root, "ignore_eos", &r->rp.ignore_eos, e));
    TRY(parse_token_id_lists(ctx, root, r, e));
    TRY(parse_bad_words(ctx, root, r, e));
    TRY(opt_bool(root, "include_stop_str_in_output", &r->rp.include_stop_str, e));
    TRY(opt_bool(root, "skip_special_tokens", &r->rp.skip_special_tokens, e));
    TRY(opt_str(root, "user", &s, e)); /* an end-user id for abuse tracking: nothing to do */
    TRY(opt_str(root, "cache_salt", &s, e));
    if (rc) {
        if (!s[0] || strlen(s) > BM_SALT_MAX) {
            rc = oai_bad(e, "cache_salt", "'cache_salt' must be a non-empty string of at most %d bytes", BM_SALT_MAX);
            goto fail;
        }
        if (!(r->cache_salt = strdup(s))) {
            rc = ERR_NOMEM;
            api_error_from_code(e, rc, NULL, NULL, "out of memory");
            goto fail;
        }
        r->rp.cache_salt = r->cache_salt;
    }
    /* vLLM's priority: lower is served sooner; only where the server orders by it */
    TRY(opt_int_msg(root, "priority", INT_MIN, INT_MAX, "an integer", &v, e));
    if (rc && v != 0 && !ctx->priority_scheduling) {
        rc = oai_bad(e, "priority", "'priority' needs priority scheduling, which this server does not use "
                                    "(--scheduling-policy priority)");
        goto fail;
    }
    if (rc) r->rp.priority = (int)v;
    return 0;
fail:
    return rc;
}

/* ---------------------------------------------------------------- prompts */

/* Tokenizes text[0, len) into a growing buffer. */
static int encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                  bool parse_special, int32_t **ids, int *n, const char *param, struct api_error *e)
{
    size_t cap = len + 16;
    if (cap > INT_MAX) return oai_bad(e, param, "'%s' is too long", param);
    *ids = NULL;
    for (;;) {
        int32_t *buf = realloc(*ids, sizeof *buf * cap);
        if (!buf) {
            free(*ids);
            *ids = NULL;
            api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
            return ERR_NOMEM;
        }
        *ids = buf;
        int got = tok_encode(t, text, len, add_special, parse_special, buf, (int)cap);
        if (got < 0) {
            free(*ids);
            *ids = NULL;
            char msg[128];
            snprintf(msg, sizeof msg, "tokenization failed (%s)", err_name(got));
            api_error_from_code(e, got, param, NULL, msg);
            return got;
        }
        if ((size_t)got <= cap) {
            *n = got;
            return 0;
        }
        cap = (size_t)got;
    }
}

size_t oai_max_prompt_bytes(const struct model *m, int max_model_len)
{
    int longest = 1, vocab = tok_vocab_size(m->tok);
    for (int id = 0; id < vocab; id++) {
        int len = tok_token_bytes(m->tok, id, false, NULL, 0);
        if (len > longest) longest = len;
    }
    return (size_t)max_model_len * (size_t)longest * 4 + 4096;
}

/* 400 context_length_exceeded for a text that cannot fit, before it is tokenized (a
 * 16 MiB prompt would take a worker a second to tokenize only to be refused). */
static int check_prompt_bytes(const struct oai_ctx *ctx, size_t len, const char *param,
                              struct api_error *e)
{
    if (!ctx->max_prompt_bytes || len <= ctx->max_prompt_bytes) return 0;
    api_error_set(e, 400, API_ERR_INVALID_REQUEST, param, "context_length_exceeded",
                  "This model's maximum context length is %d tokens. However, your %s is %zu "
                  "bytes long, more than %d tokens can hold (at most %zu bytes). Please "
                  "reduce the length of the %s.", ctx->max_model_len,
                  !strcmp(param, "messages") ? "rendered prompt" : "prompt", len,
                  ctx->max_model_len, ctx->max_prompt_bytes,
                  !strcmp(param, "messages") ? "messages" : "prompt");
    return ERR_RANGE;
}

int oai_encode_text(const struct oai_ctx *ctx, const char *text, size_t len, bool add_special,
                    bool limit, const char *param, int32_t **ids, int *n, struct api_error *e)
{
    *ids = NULL;
    int rc = limit ? check_prompt_bytes(ctx, len, param, e) : 0;
    if (rc) return rc;
    return encode(ctx->m->tok, text, len, add_special, false, ids, n, param, e);
}

/* Variables the server puts into the template context, and the template's globals:
 * chat_template_kwargs must not replace them (the messages were validated, the tools
 * checked, the specials are the model's). */
static const char *const RESERVED_TEMPLATE_VARS[] = {
    "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
    "raise_exception", "strftime_now", "namespace", "range", "dict",
};

static int check_template_kwargs(const cJSON *kwargs, struct api_error *e)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, kwargs) {
        for (size_t i = 0; i < sizeof RESERVED_TEMPLATE_VARS / sizeof *RESERVED_TEMPLATE_VARS; i++)
            if (!strcmp(it->string, RESERVED_TEMPLATE_VARS[i])) {
                char param[96];
                snprintf(param, sizeof param, "chat_template_kwargs.%s", it->string);
                return oai_bad(e, param,
                           "'chat_template_kwargs' cannot set '%s': the server sets it%s", it->string,
                           !strcmp(it->string, "tools") || !strcmp(it->string, "messages") ||
                                   !strcmp(it->string, "add_generation_prompt")
                               ? " from the request's own parameter of that name" : "");
            }
    }
    return 0;
}

/* The parameter path that starts chat.c's messages ("messages[1].role must be ..."). */
static void param_from_message(const char *err, char *param, size_t cap)
{
    size_t n = strcspn(err, " ");
    if (strncmp(err, "messages", 8) != 0) n = 0;
    snprintf(param, cap, "%.*s", n ? (int)n : 8, n ? err : "messages");
}

int oai_chat_options(const cJSON *root, struct oai_chat_opts *o, struct api_error *e)
{
    *o = (struct oai_chat_opts){ .add_generation_prompt = true };
    o->tools = oai_opt(root, "tools");
    o->kwargs = oai_opt(root, "chat_template_kwargs");
    o->documents = oai_opt(root, "documents");
    if (o->tools && !cJSON_IsArray(o->tools)) return oai_bad(e, "tools", "'tools' must be an array");
    if (o->kwargs && !cJSON_IsObject(o->kwargs))
        return oai_bad(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (o->documents && !cJSON_IsArray(o->documents))
        return oai_bad(e, "documents", "'documents' must be an array");
    int rc = opt_bool(root, "continue_final_message", &o->continue_final, e);
    if (rc < 0) return rc;
    if (o->continue_final) {
        if (cJSON_IsTrue(oai_opt(root, "add_generation_prompt")))
            return oai_bad(e, "continue_final_message",
                           "'continue_final_message' and 'add_generation_prompt' cannot both be true: "
                           "continue the final message, or start a new assistant message");
        o->add_generation_prompt = false;
    }
    if ((rc = opt_bool(root, "add_generation_prompt", &o->add_generation_prompt, e)) < 0) return rc;
    rc = opt_bool(root, "add_special_tokens", &o->add_special, e);
    return rc < 0 ? rc : 0;
}

/* The last occurrence of needle[0, n) in hay[0, len), or NULL; n == 0 finds hay + len. */
static const char *find_last(const char *hay, size_t len, const char *needle, size_t n)
{
    if (n > len) return NULL;
    for (size_t i = len - n + 1; i-- > 0;)
        if (!memcmp(hay + i, needle, n)) return hay + i;
    return NULL;
}

/* continue_final_message, as Hugging Face's apply_chat_template does it: the rendered
 * text ends right after the final message's content, so that the model continues that
 * message rather than starting a new one. The content is looked for from the end as it
 * is, then without its surrounding white space (templates such as Llama 3.1's trim it). */
static int cut_after_final_message(const cJSON *messages, char *text, size_t *len, struct api_error *e)
{
    char *c = chat_content_text(cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1));
    if (!c) return oai_nomem(e);
    const char *s = c;
    size_t n = strlen(c);
    const char *at = find_last(text, *len, s, n);
    if (!at) {
        while (n > 0 && isspace((unsigned char)*s)) s++, n--;
        while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
        at = find_last(text, *len, s, n);
    }
    free(c);
    if (!at)
        return oai_bad(e, "continue_final_message",
                       "the final message's content does not appear in the prompt the chat template "
                       "renders, so it cannot be continued");
    *len = (size_t)(at - text) + n;
    text[*len] = 0;
    return 0;
}

int oai_encode_chat(const struct oai_ctx *ctx, const cJSON *messages, const struct oai_chat_opts *o,
                    bool limit, int32_t **ids, int *n, struct api_error *e)
{
    const struct model *m = ctx->m;
    char err[ERR_BUF], param[64];
    *ids = NULL;
    if (!messages) return oai_bad(e, "messages", "Missing required parameter: 'messages'");
    int rc = chat_validate_messages(messages, err, sizeof err);
    if (rc) {
        param_from_message(err, param, sizeof param);
        return oai_bad(e, param, "%s", err);
    }
    if (o->kwargs && (rc = check_template_kwargs(o->kwargs, e))) return rc;
    if (!m->tmpl)
        return oai_bad(e, NULL, "this model has no chat template; use /v1/completions with a plain prompt");
    cJSON *converted = NULL; /* tool-call arguments as the template wants them */
    if ((rc = oai_messages_for_template(m, messages, &converted, e))) return rc;
    cJSON *extra = NULL; /* the kwargs, plus documents */
    if (o->documents) {
        extra = o->kwargs ? cJSON_Duplicate(o->kwargs, 1) : cJSON_CreateObject();
        if (!extra || !cJSON_AddItemToObject(extra, "documents", cJSON_Duplicate(o->documents, 1))) {
            cJSON_Delete(extra);
            cJSON_Delete(converted);
            return oai_nomem(e);
        }
    }
    struct chat_specials sp = { m->bos_token ? m->bos_token : "", m->eos_token ? m->eos_token : "" };
    char *text = NULL;
    size_t len = 0;
    rc = chat_render(m->tmpl, &sp, converted ? converted : messages, o->tools, extra ? extra : o->kwargs,
                     o->add_generation_prompt, &text, &len, err, sizeof err);
    cJSON_Delete(converted);
    cJSON_Delete(extra);
    if (rc) {
        free(text);
        if (rc == ERR_NOMEM) return api_error_from_code(e, rc, NULL, NULL, err), rc;
        return oai_bad(e, "messages", "the chat template failed: %s", err);
    }
    if (o->continue_final && (rc = cut_after_final_message(messages, text, &len, e))) {
        free(text);
        return rc;
    }
    /* The template writes BOS itself when the model wants one (Hugging Face's
     * apply_chat_template and the CLI's --chat do not add specials); only a tokenizer that
     * always adds BOS gets it prepended, and then only if the template left it out. */
    rc = limit ? check_prompt_bytes(ctx, len, "messages", e) : 0;
    if (!rc) rc = encode(m->tok, text, len, o->add_special, true, ids, n, "messages", e);
    free(text);
    if (rc) return rc;
    int bos = tok_bos_id(m->tok);
    if (!o->add_special && tok_adds_bos(m->tok) && bos >= 0 && (*n == 0 || (*ids)[0] != bos)) {
        int32_t *buf = realloc(*ids, sizeof *buf * (size_t)(*n + 1));
        if (!buf) {
            free(*ids);
            *ids = NULL;
            api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
            return ERR_NOMEM;
        }
        memmove(buf + 1, buf, sizeof *buf * (size_t)*n);
        buf[0] = bos;
        *ids = buf;
        (*n)++;
    }
    return 0;
}

static int parse_messages(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                          struct api_error *e)
{
    struct oai_chat_opts o;
    int rc = oai_chat_options(root, &o, e);
    if (rc < 0) return rc;
    rc = oai_encode_chat(ctx, oai_opt(root, "messages"), &o, r->truncate == 0, &r->prompt_ids, &r->n_prompt, e);
    r->prompt_off[1] = r->n_prompt;
    return rc;
}

/* An array of token ids, each in [0, vocab): *ids (malloc'd) and *n. what names the
 * array in messages ("'prompt'", "'prompt'[2]"). */
static int parse_id_array(const struct oai_ctx *ctx, const cJSON *arr, const char *what, int32_t **ids,
                          int *n, struct api_error *e)
{
    int len = cJSON_GetArraySize(arr), vocab = ctx->m->cfg.vocab_size, i = 0;
    if (len == 0) return oai_bad(e, "prompt", "%s must not be empty", what);
    if (!(*ids = malloc(sizeof **ids * (size_t)len))) {
        api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
        return ERR_NOMEM;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d))
            return oai_bad(e, "prompt", "%s[%d] must be an integer token id", what, i);
        if (d < 0 || d >= vocab)
            return oai_bad(e, "prompt", "%s[%d] = %.0f is not a token id in [0, %d)", what, i, d, vocab);
        (*ids)[i++] = (int32_t)d;
    }
    *n = len;
    return 0;
}

/* One prompt, a string or an array of token ids: *ids (malloc'd; NULL on error) and *n.
 * limit: refuse a text too long for the context before tokenizing it (not when the
 * prompt is to be truncated). */
static int parse_one_prompt(const struct oai_ctx *ctx, const cJSON *p, const char *what, bool limit, int32_t **ids,
                            int *n, struct api_error *e)
{
    *ids = NULL;
    int rc;
    if (cJSON_IsArray(p)) {
        rc = parse_id_array(ctx, p, what, ids, n, e);
    } else if (!cJSON_IsString(p)) {
        rc = oai_bad(e, "prompt", "%s must be a string or an array of token ids", what);
    } else {
        /* user text: specials are plain text; BOS as the tokenizer's post-processor says */
        rc = oai_encode_text(ctx, p->valuestring, strlen(p->valuestring), true, limit, "prompt", ids, n, e);
        if (!rc && *n == 0) rc = oai_bad(e, "prompt", "%s must not be empty", what);
    }
    if (rc) {
        free(*ids);
        *ids = NULL;
    }
    return rc;
}

/* prompt: "text", [id, ...], or a batch of up to OAI_MAX_PROMPTS of those: ["text", ...] or
 * [[id, ...], ...]. A batch's prompts go one after another into r->prompt_ids. */
static int parse_prompt(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                        struct api_error *e)
{
    const cJSON *p = oai_opt(root, "prompt");
    if (!p) return oai_bad(e, "prompt", "Missing required parameter: 'prompt'");
    const cJSON *first = cJSON_IsArray(p) ? cJSON_GetArrayItem(p, 0) : NULL;
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 0) return oai_bad(e, "prompt", "'prompt' must not be empty");
    if (!first || cJSON_IsNumber(first)) { /* one prompt */
        int rc = parse_one_prompt(ctx, p, "'prompt'", r->truncate == 0, &r->prompt_ids, &r->n_prompt, e);
        r->n_prompts = 1;
        r->prompt_off[1] = r->n_prompt;
        return rc;
    }
    int n = cJSON_GetArraySize(p);
    if (n > OAI_MAX_PROMPTS)
        return oai_bad(e, "prompt", "a batch of %d prompts is more than %d; split it into several requests", n,
                       OAI_MAX_PROMPTS);
    if ((int64_t)n * r->n > OAI_MAX_CHOICES)
        return oai_bad(e, "prompt", "%d prompts x n = %d would be %d choices, more than %d", n, r->n, n * r->n,
                       OAI_MAX_CHOICES);
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        char what[32];
        snprintf(what, sizeof what, "'prompt'[%d]", k);
        if (!cJSON_IsString(it) && !cJSON_IsArray(it))
            return oai_bad(e, "prompt", "%s must be a string or an array of token ids", what);
        int32_t *ids;
        int len;
        int rc = parse_one_prompt(ctx, it, what, r->truncate == 0, &ids, &len, e);
        if (rc) return rc;
        int32_t *all = realloc(r->prompt_ids, sizeof *all * ((size_t)r->n_prompt + (size_t)len));
        if (!all) {
            free(ids);
            api_error_from_code(e, ERR_NOMEM, NULL, NULL, "out of memory");
            return ERR_NOMEM;
        }
        memcpy(all + r->n_prompt, ids, sizeof *ids * (size_t)len);
        free(ids);
        r->prompt_ids = all;
        r->n_prompt += len;
        r->prompt_off[++k] = r->n_prompt;
    }
    r->n_prompts = n;
    return 0;
}

/* echo: each prompt's text, as given (a string) or decoded (ids, specials kept). */
static int fill_echo(const struct oai_ctx *ctx, const cJSON *p, struct oai_request *r, struct api_error *e)
{
    for (int k = 0; k < r->n_prompts; k++) {
        const cJSON *item = r->n_prompts == 1 && (!cJSON_IsArray(p) || cJSON_IsNumber(cJSON_GetArrayItem(p, 0)))
                                ? p : cJSON_GetArrayItem(p, k);
        int len;
        const int32_t *ids = oai_prompt(r, k, &len);
        if (cJSON_IsString(item) && (!r->truncate || len <= r->truncate)) {
            r->echo[k] = strdup(item->valuestring);
        } else { /* ids, or a prompt truncate_prompt_tokens cuts: the tokens that remain */
            int keep = r->truncate && len > r->truncate ? r->truncate : len;
            r->echo[k] = tok_decode(ctx->m->tok, ids + len - keep, keep, false);
        }
        if (!r->echo[k]) return oai_nomem(e);
    }
    return 0;
}

/* truncate_prompt_tokens: each prompt keeps its last r->truncate tokens. */
static void truncate_prompts(struct oai_request *r)
{
    int out = 0;
    for (int k = 0; k < r->n_prompts; k++) {
        int start = r->prompt_off[k], len = r->prompt_off[k + 1] - start;
        int keep = len > r->truncate ? r->truncate : len;
        memmove(r->prompt_ids + out, r->prompt_ids + start + len - keep, sizeof *r->prompt_ids * (size_t)keep);
        r->prompt_off[k] = out;
        out += keep;
    }
    r->prompt_off[r->n_prompts] = out;
    r->n_prompt = out;
}

/* The longest prompt of r. */
static int longest_prompt(const struct oai_request *r)
{
    int m = 0;
    for (int k = 0; k < r->n_prompts; k++) {
        int len = r->prompt_off[k + 1] - r->prompt_off[k];
        if (len > m) m = len;
    }
    return m;
}

/* ---------------------------------------------------------------- requests */

/* Parses a request body's JSON tree (borrowed) into out. */
static int parse_root(const struct oai_ctx *ctx, enum oai_kind kind, const cJSON *root, struct oai_request *out,
                      struct api_error *e)
{
    memset(out, 0, sizeof *out);
    req_params_default(&out->rp);
    out->kind = kind;
    out->n = 1;
    out->n_prompts = 1;
    out->top_logprobs = -1;
    out->prompt_logprobs = -1;
    int64_t max_req = 0; /* the max_tokens asked for, 0 if none */
    const char *max_key = "max_tokens";
    const char *what = kind == OAI_CHAT ? "messages" : "prompt";
    int rc;
    if (!cJSON_IsObject(root)) { rc = oai_bad(e, NULL, "the request body must be a JSON object"); goto fail; }
    TRY(parse_options(ctx, root, out, &max_req, &max_key, e));
    if (kind == OAI_CHAT) TRY(oai_parse_tools(ctx, root, out, e));
    TRY(kind == OAI_CHAT ? parse_messages(ctx, root, out, e) : parse_prompt(ctx, root, out, e));
    if (out->echo_on) TRY(fill_echo(ctx, oai_opt(root, "prompt"), out, e));
    if (out->truncate) truncate_prompts(out);
    oai_parse_reasoning(ctx, root, out);

    int longest = longest_prompt(out); /* a batch: every prompt must fit */
    if (longest >= ctx->max_model_len) {
        api_error_set(e, 400, API_ERR_INVALID_REQUEST, what, "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, your request "
                      "has %d input tokens. Please reduce the length of the %s.",
                      ctx->max_model_len, longest,
                      kind == OAI_CHAT ? "input messages" : "prompt");
        rc = ERR_RANGE;
        goto fail;
    }
    if (max_req && longest + max_req > ctx->max_model_len) {
        api_error_set(e, 400, API_ERR_INVALID_REQUEST, what, "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, you requested "
                      "%lld tokens (%d in the %s, %lld in the completion). Please reduce the length "
                      "of the %s or '%s'.",
                      ctx->max_model_len, (long long)(longest + max_req), longest,
                      what, (long long)max_req, what, max_key);
        rc = ERR_RANGE;
        goto fail;
    }
    /* last: compiling a schema costs more than every check above */
    TRY(oai_parse_structured(ctx, root, out, e));
    oai_defer_grammar_for_reasoning(ctx, out);
    return 0;
fail:
    oai_request_free(out);
    return rc;
}

static int parse_request(const struct oai_ctx *ctx, enum oai_kind kind, const char *body,
                         size_t len, struct oai_request *out, struct api_error *e)
{
    memset(out, 0, sizeof *out);
    cJSON *root = oai_parse_body(body, len, e);
    if (!root) return ERR_INVALID;
    int rc = parse_root(ctx, kind, root, out, e);
    cJSON_Delete(root);
    return rc;
}

int oai_parse_chat(const struct oai_ctx *ctx, const char *body, size_t len,
                   struct oai_request *out, struct api_error *e)
{
    return parse_request(ctx, OAI_CHAT, body, len, out, e);
}

int oai_parse_chat_root(const struct oai_ctx *ctx, const struct cJSON *root, struct oai_request *out,
                        struct api_error *e)
{
    return parse_root(ctx, OAI_CHAT, root, out, e);
}

int oai_parse_completion(const struct oai_ctx *ctx, const char *body, size_t len,
                         struct oai_request *out, struct api_error *e)
{
    return parse_request(ctx, OAI_COMPLETION, body, len, out, e);
}

void oai_request_free(struct oai_request *r)
{
    if (!r) return;
    free(r->prompt_ids);
    for (int i = 0; i < OAI_MAX_PROMPTS; i++) free(r->echo[i]);
    for (int i = 0; i < STOP_MAX_STRINGS; i++) free(r->stop_strs[i]);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->allowed_ids);
    free(r->bad_words);
    free(r->cache_salt);
    grammar_unref(r->grammar);
    free(r->tool_schema);
    free(r->resp_echo);
    free(r->resp_items);
    memset(r, 0, sizeof *r);
}
