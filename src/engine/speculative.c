/* speculative.c — see speculative.h. */
#include "engine/speculative.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* An integer member of obj: absent (0, *present false), or an integer in [lo, hi]. */
static int json_int(const cJSON *obj, const char *key, int lo, int hi, int *v, bool *present, char *err,
                    size_t errlen)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *present = it != NULL;
    if (!it) return 0;
    double d = it->valuedouble;
    if (!cJSON_IsNumber(it) || d != floor(d))
        return err_set(err, errlen, ERR_INVALID, "--speculative-config: \"%s\" must be an integer", key);
    if (d < lo || d > hi)
        return err_set(err, errlen, ERR_RANGE, "--speculative-config: \"%s\" is %g; it must be in [%d, %d]", key, d,
                       lo, hi);
    *v = (int)d;
    return 0;
}

int spec_config_parse(const char *json, struct spec_config *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!json || !*json) return 0;
    static const char *const known[] = { "method", "num_speculative_tokens", "prompt_lookup_max",
                                         "prompt_lookup_min", "disable_by_batch_size" };
    cJSON *root = cJSON_Parse(json);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        rc = err_set(err, errlen, ERR_INVALID,
                     "--speculative-config: not a JSON object; e.g. '{\"method\": \"ngram\", "
                     "\"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}'");
        goto done;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok = ok || !strcmp(it->string, known[i]);
        if (!ok) {
            rc = err_set(err, errlen, ERR_INVALID,
                         "--speculative-config: unknown key \"%s\" (accepted: method, num_speculative_tokens, "
                         "prompt_lookup_max, prompt_lookup_min, disable_by_batch_size)", it->string);
            goto done;
        }
    }
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(root, "method");
    if (!cJSON_IsString(method) || strcmp(method->valuestring, "ngram")) {
        rc = err_set(err, errlen, ERR_INVALID,
                     "--speculative-config: \"method\" must be \"ngram\" (n-gram prompt lookup; draft models, "
                     "EAGLE and MTP are not supported)");
        goto done;
    }
    struct spec_config c = { 0 };
    bool has_n, has_min, has_max, has_limit;
    if ((rc = json_int(root, "num_speculative_tokens", 1, SPEC_MAX_TOKENS, &c.num_tokens, &has_n, err, errlen)) ||
        (rc = json_int(root, "prompt_lookup_min", 1, SPEC_MAX_NGRAM, &c.lookup_min, &has_min, err, errlen)) ||
        (rc = json_int(root, "prompt_lookup_max", 1, SPEC_MAX_NGRAM, &c.lookup_max, &has_max, err, errlen)) ||
        (rc = json_int(root, "disable_by_batch_size", 2, SPEC_MAX_BATCH_LIMIT, &c.disable_by_batch_size, &has_limit,
                       err, errlen)))
        goto done;
    if (!has_n) {
        rc = err_set(err, errlen, ERR_INVALID, "--speculative-config: \"num_speculative_tokens\" is required");
        goto done;
    }
    /* vLLM's defaults: neither bound given = 5..5; one given = both that */
    if (!has_min && !has_max) c.lookup_min = c.lookup_max = 5;
    else if (!has_min) c.lookup_min = c.lookup_max;
    else if (!has_max) c.lookup_max = c.lookup_min;
    if (c.lookup_min > c.lookup_max) {
        rc = err_set(err, errlen, ERR_RANGE,
                     "--speculative-config: \"prompt_lookup_min\" %d is above \"prompt_lookup_max\" %d",
                     c.lookup_min, c.lookup_max);
        goto done;
    }
    if ((rc = spec_config_check(&c, err, errlen))) goto done; /* the keys' bounds above are its bounds */
    *out = c;
done:
    cJSON_Delete(root);
    return rc;
}

int spec_config_check(const struct spec_config *c, char *err, size_t errlen)
{
    if (c->num_tokens == 0) return 0;
    if (c->num_tokens < 0 || c->num_tokens > SPEC_MAX_TOKENS)
        return err_set(err, errlen, ERR_RANGE, "speculative decoding: %d tokens, not in [1, %d]", c->num_tokens,
                       SPEC_MAX_TOKENS);
    if (c->lookup_min < 1 || c->lookup_max < c->lookup_min || c->lookup_max > SPEC_MAX_NGRAM)
        return err_set(err, errlen, ERR_RANGE, "speculative decoding: n-gram %d..%d, not within [1, %d]",
                       c->lookup_min, c->lookup_max, SPEC_MAX_NGRAM);
    if (c->disable_by_batch_size < 0)
        return err_set(err, errlen, ERR_RANGE, "speculative decoding: disable_by_batch_size %d < 0",
                       c->disable_by_batch_size);
    return 0;
}

void spec_config_describe(const struct spec_config *c, char *buf, size_t cap)
{
    if (c->num_tokens <= 0) snprintf(buf, cap, "off");
    else if (c->disable_by_batch_size > 0)
        snprintf(buf, cap, "ngram, %d tokens, n-gram %d..%d, up to %d running", c->num_tokens, c->lookup_min,
                 c->lookup_max, c->disable_by_batch_size);
    else
        snprintf(buf, cap, "ngram, %d tokens, n-gram %d..%d", c->num_tokens, c->lookup_min, c->lookup_max);
}

int spec_ngram_propose(const int32_t *tokens, int n, const struct spec_config *c, int max_tokens, int32_t *out)
{
    if (c->num_tokens <= 0 || max_tokens <= 0 || n < c->lookup_min + 1) return 0;
    if (max_tokens > c->num_tokens) max_tokens = c->num_tokens;
    const int32_t last = tokens[n - 1];
    int best_len = 0, best_end = -1, best_follow = 0;
    /* candidate occurrences end at e < n - 1 with tokens[e] == the last token, the most
     * recent first; the best is the longest match, then the one followed by the most
     * tokens (up to max_tokens: a run like "a a a a" matches right before its end, where
     * one token follows, and further back, where more do), then the most recent */
    for (int e = n - 2; e >= 0; e--) {
        if (tokens[e] != last) continue;
        int len = 1;
        while (len < c->lookup_max && len <= e && tokens[e - len] == tokens[n - 1 - len]) len++;
        int follow = n - 1 - e < max_tokens ? n - 1 - e : max_tokens;
        if (len > best_len || (len == best_len && follow > best_follow)) {
            best_len = len, best_end = e, best_follow = follow;
            if (len == c->lookup_max && follow == max_tokens) break; /* nothing can beat it */
        }
    }
    if (best_len < c->lookup_min) return 0;
    memcpy(out, tokens + best_end + 1, sizeof *out * (size_t)best_follow);
    return best_follow;
}
