/* openai_tokenize.c — POST /tokenize and POST /detokenize (vLLM's extra endpoints).
 *
 * /tokenize counts exactly what a generation request would send to the engine: a prompt
 * is tokenized as /v1/completions does (specials as plain text), messages as
 * /v1/chat/completions does (template, specials parsed). Pure; any thread.
 */
#include "api/openai.h"
#include "api/openai_internal.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A JSON body of root printed into *out (root is freed). */
static int print_body(cJSON *root, char **out, struct api_error *e)
{
    *out = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return *out ? 0 : oai_nomem(e);
}

/* Returns the optional boolean key of obj in *v; negative code if it is not a boolean. */
static int opt_bool(const cJSON *obj, const char *key, bool *v, struct api_error *e)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsBool(it)) {
        api_error_set(e, 400, API_ERR_INVALID_REQUEST, key, NULL, "'%s' must be a boolean", key);
        return ERR_INVALID;
    }
    *v = cJSON_IsTrue(it);
    return 0;
}

int oai_tokenize(const struct oai_ctx *ctx, const char *body, size_t len, char **out,
                 struct api_error *e)
{
    *out = NULL;
    int32_t *ids = NULL;
    int n = 0, rc;
    const char *model = NULL;
    cJSON *root = oai_parse_body(body, len, e), *res = NULL;
    if (!root) return ERR_INVALID;
    if (!cJSON_IsObject(root)) { rc = oai_bad(e, NULL, "the request body must be a JSON object"); goto done; }
    if ((rc = oai_check_model(ctx, root, &model, e))) goto done;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (prompt && !cJSON_IsNull(prompt)) {
        if (!cJSON_IsString(prompt)) { rc = oai_bad(e, "prompt", "'prompt' must be a string"); goto done; }
        bool add_special = true;
        if ((rc = opt_bool(root, "add_special_tokens", &add_special, e))) goto done;
        rc = oai_encode_text(ctx, prompt->valuestring, strlen(prompt->valuestring), add_special,
                             false, "prompt", &ids, &n, e);
    } else if (msgs && !cJSON_IsNull(msgs)) {
        struct oai_chat_opts o;
        if ((rc = oai_chat_options(root, &o, e))) goto done;
        rc = oai_encode_chat(ctx, msgs, &o, false, &ids, &n, e);
    } else {
        rc = oai_bad(e, NULL, "the body must contain 'prompt' (a string) or 'messages' (an array)");
    }
    if (rc) goto done;
    res = cJSON_CreateObject();
    cJSON *arr = res && cJSON_AddNumberToObject(res, "count", n) &&
                         cJSON_AddNumberToObject(res, "max_model_len", ctx->max_model_len)
                     ? cJSON_AddArrayToObject(res, "tokens") : NULL;
    if (!arr) {
        rc = oai_nomem(e);
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (!cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]))) { rc = oai_nomem(e); goto done; }
    rc = print_body(res, out, e);
    res = NULL;
done:
    cJSON_Delete(res);
    cJSON_Delete(root);
    free(ids);
    return rc;
}

int oai_detokenize(const struct oai_ctx *ctx, const char *body, size_t len, char **out,
                   struct api_error *e)
{
    *out = NULL;
    int rc = 0;
    char *text = NULL;
    const char *model = NULL;
    cJSON *root = oai_parse_body(body, len, e), *res = NULL;
    if (!root) return ERR_INVALID;
    if (!cJSON_IsObject(root)) { rc = oai_bad(e, NULL, "the request body must be a JSON object"); goto done; }
    if ((rc = oai_check_model(ctx, root, &model, e))) goto done;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks)) { rc = oai_bad(e, "tokens", "'tokens' must be an array of token ids"); goto done; }
    int vocab = tok_vocab_size(ctx->m->tok), i = 0;
    size_t total = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, toks) {
        double d = cJSON_IsNumber(t) ? t->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || d < 0 || d >= vocab) {
            api_error_set(e, 400, API_ERR_INVALID_REQUEST, "tokens", NULL,
                          "'tokens'[%d] must be a token id in [0, %d)", i, vocab);
            rc = ERR_INVALID;
            goto done;
        }
        total += (size_t)tok_token_bytes(ctx->m->tok, (int)d, false, NULL, 0);
        i++;
    }
    /* the bytes are joined here rather than by tok_decode so that a NUL byte token does
     * not cut the text short */
    if (!(text = malloc(total + 1))) { rc = oai_nomem(e); goto done; }
    size_t o = 0;
    cJSON_ArrayForEach(t, toks)
        o += (size_t)tok_token_bytes(ctx->m->tok, (int)t->valuedouble, false, text + o, (int)(total - o));
    cJSON *s = oai_json_string(text, o);
    res = cJSON_CreateObject();
    if (!s || !res || !cJSON_AddItemToObject(res, "prompt", s)) {
        if (!cJSON_GetObjectItemCaseSensitive(res, "prompt")) cJSON_Delete(s);
        rc = oai_nomem(e);
        goto done;
    }
    rc = print_body(res, out, e);
    res = NULL;
done:
    cJSON_Delete(res);
    cJSON_Delete(root);
    free(text);
    return rc;
}
