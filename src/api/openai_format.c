/* openai_format.c — response bodies and SSE events in OpenAI's shapes (see openai.h):
 * chat / completion chunks, usage chunks, whole responses, /v1/models, request ids.
 *
 * Generated text and token strings are arbitrary bytes: they go through oai_json_string,
 * so the JSON is always valid UTF-8 (invalid bytes → U+FFFD) while a chat logprob's
 * "bytes" keeps the raw bytes. Logprobs that are not finite are sent as -9999.0 (vLLM's
 * convention; JSON has no -inf). Pure functions; any thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/openai.h"
#include "api/openai_internal.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---------------------------------------------------------------- strings */

cJSON *oai_json_string(const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    /* worst case: every byte a \u00XX escape (6) or U+FFFD (3) */
    char *buf = malloc(len * 6 + 3);
    if (!buf) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;
    buf[o++] = '"';
    while (i < len) {
        unsigned c = p[i];
        if (c >= 0x80) {
            int n = oai_utf8_seq_len(p + i, len - i);
            if (n) {
                memcpy(buf + o, p + i, (size_t)n);
                o += (size_t)n;
                i += (size_t)n;
            } else {
                memcpy(buf + o, "\xef\xbf\xbd", 3);
                o += 3;
                i++;
            }
            continue;
        }
        i++;
        switch (c) {
        case '"': buf[o++] = '\\'; buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; buf[o++] = '\\'; break;
        case '\n': buf[o++] = '\\'; buf[o++] = 'n'; break;
        case '\r': buf[o++] = '\\'; buf[o++] = 'r'; break;
        case '\t': buf[o++] = '\\'; buf[o++] = 't'; break;
        default:
            if (c < 0x20) {
                memcpy(buf + o, "\\u00", 4);
                buf[o + 4] = hex[c >> 4];
                buf[o + 5] = hex[c & 15];
                o += 6;
            } else {
                buf[o++] = (char)c;
            }
        }
    }
    buf[o++] = '"';
    buf[o] = 0;
    cJSON *item = cJSON_CreateRaw(buf);
    free(buf);
    return item;
}

/* s[0, len) as a NUL-terminated valid UTF-8 C string (invalid bytes and NUL → U+FFFD), for
 * object keys, which cJSON escapes itself. Caller frees. */
static char *utf8_cstr(const char *s, size_t len)
{
    char *buf = malloc(len * 3 + 1);
    if (!buf) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, i = 0;
    while (i < len) {
        int n = p[i] ? oai_utf8_seq_len(p + i, len - i) : 0;
        if (n) {
            memcpy(buf + o, p + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = 0;
    return buf;
}

/* Adds s[0, len) to obj under key; false on OOM. */
static bool add_text(cJSON *obj, const char *key, const char *s, size_t len)
{
    cJSON *v = oai_json_string(s, len);
    return v && cJSON_AddItemToObject(obj, key, v);
}

static double lp_value(float f)
{
    return isfinite(f) ? (double)f : -9999.0;
}

/* The bytes of token id (not skipping specials) in a malloc'd buffer; *len its length
 * (0 for an id outside the tokenizer). NULL only on OOM. */
static char *token_bytes(const struct model *m, int32_t id, size_t *len)
{
    int n = m && m->tok ? tok_token_bytes(m->tok, id, false, NULL, 0) : 0;
    if (n < 0) n = 0;
    char *buf = malloc((size_t)n + 1);
    if (!buf) return NULL;
    if (n) tok_token_bytes(m->tok, id, false, buf, n);
    *len = (size_t)n;
    return buf;
}

/* ---------------------------------------------------------------- logprobs */

/* {"token", "logprob", "bytes": [...]} */
static cJSON *chat_token_lp(const struct model *m, int32_t id, float logprob)
{
    size_t len = 0;
    char *b = token_bytes(m, id, &len);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    bool ok = b && o && bytes && add_text(o, "token", b, len) &&
              cJSON_AddNumberToObject(o, "logprob", lp_value(logprob));
    for (size_t i = 0; ok && i < len; i++)
        ok = cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    free(b);
    if (!ok || !cJSON_AddItemToObject(o, "bytes", bytes)) {
        cJSON_Delete(bytes);
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *oai_token_logprobs(const struct model *m, const struct req_logprob *lps, int n, int top_logprobs)
{
    cJSON *content = cJSON_CreateArray();
    if (!content) return NULL;
    for (int i = 0; i < n; i++) {
        const struct req_logprob *lp = &lps[i];
        cJSON *t = chat_token_lp(m, lp->token, lp->logprob);
        if (!t || !cJSON_AddItemToArray(content, t)) { cJSON_Delete(t); goto fail; }
        cJSON *top = cJSON_AddArrayToObject(t, "top_logprobs");
        if (!top) goto fail;
        int k = top_logprobs < lp->n_top ? top_logprobs : lp->n_top;
        for (int j = 0; j < k; j++) {
            cJSON *a = chat_token_lp(m, lp->top_ids[j], lp->top_logprobs[j]);
            if (!a || !cJSON_AddItemToArray(top, a)) { cJSON_Delete(a); goto fail; }
        }
    }
    return content;
fail:
    cJSON_Delete(content);
    return NULL;
}

/* {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]} */
static cJSON *chat_logprobs(const struct model *m, const struct oai_piece *p)
{
    cJSON *o = cJSON_CreateObject(), *content = oai_token_logprobs(m, p->lp, p->n_lp, p->top_logprobs);
    if (o && content && cJSON_AddItemToObject(o, "content", content)) return o;
    cJSON_Delete(content);
    cJSON_Delete(o);
    return NULL;
}

/* Adds {token string: logprob} to obj (the key made valid UTF-8). */
static bool add_top_entry(const struct model *m, cJSON *obj, int32_t id, float logprob)
{
    size_t len = 0;
    char *b = token_bytes(m, id, &len);
    char *key = b ? utf8_cstr(b, len) : NULL;
    free(b);
    bool ok = key && cJSON_AddNumberToObject(obj, key, lp_value(logprob));
    free(key);
    return ok;
}

/* The four parallel arrays of legacy completions logprobs. */
struct lp_arrays {
    cJSON *tokens, *lps, *tops, *offs;
    int64_t off; /* text_offset of the next token */
};

/* Appends one token: its string, text offset, logprob and top map, or (lp NULL: the
 * prompt's first token, which nothing predicts) null for both. Like vLLM, a top map also
 * holds the token itself. */
static bool add_lp_token(const struct model *m, struct lp_arrays *a, int32_t token, const struct req_logprob *lp,
                         int top_logprobs)
{
    size_t len = 0;
    char *b = token_bytes(m, token, &len);
    if (!b) return false;
    cJSON *s = oai_json_string(b, len);
    size_t chars = oai_utf8_chars(b, len);
    free(b);
    if (!s || !cJSON_AddItemToArray(a->tokens, s)) { cJSON_Delete(s); return false; }
    if (!cJSON_AddItemToArray(a->offs, cJSON_CreateNumber((double)a->off))) return false;
    a->off += (int64_t)chars;
    if (!lp) return cJSON_AddItemToArray(a->lps, cJSON_CreateNull()) && cJSON_AddItemToArray(a->tops, cJSON_CreateNull());
    if (!cJSON_AddItemToArray(a->lps, cJSON_CreateNumber(lp_value(lp->logprob)))) return false;
    cJSON *top = cJSON_CreateObject();
    if (!top || !cJSON_AddItemToArray(a->tops, top)) { cJSON_Delete(top); return false; }
    int k = top_logprobs < lp->n_top ? top_logprobs : lp->n_top;
    bool has_token = false;
    for (int j = 0; j < k; j++) {
        if (!add_top_entry(m, top, lp->top_ids[j], lp->top_logprobs[j])) return false;
        has_token |= lp->top_ids[j] == lp->token;
    }
    return has_token || add_top_entry(m, top, lp->token, lp->logprob);
}

/* {"tokens", "token_logprobs", "top_logprobs": [{tok: lp}], "text_offset"} (legacy
 * completions): the prompt's tokens first when the piece carries them (echo), then the
 * generated ones. */
static cJSON *completion_logprobs(const struct model *m, const struct oai_piece *p)
{
    cJSON *o = cJSON_CreateObject();
    struct lp_arrays a = { cJSON_AddArrayToObject(o, "tokens"), cJSON_AddArrayToObject(o, "token_logprobs"),
                           cJSON_AddArrayToObject(o, "top_logprobs"), cJSON_AddArrayToObject(o, "text_offset"),
                           p->text_offset };
    if (!a.offs) goto fail;
    if (p->prompt_lp && !add_lp_token(m, &a, p->prompt_first, NULL, p->top_logprobs)) goto fail;
    for (int i = 0; p->prompt_lp && i < p->n_plp; i++)
        if (!add_lp_token(m, &a, p->plp[i].token, &p->plp[i], p->top_logprobs)) goto fail;
    for (int i = 0; i < p->n_lp; i++)
        if (!add_lp_token(m, &a, p->lp[i].token, &p->lp[i], p->top_logprobs)) goto fail;
    return o;
fail:
    cJSON_Delete(o);
    return NULL;
}

/* Adds "id": {"logprob", "rank", "decoded_token"} to obj (one entry of vLLM's
 * prompt_logprobs). */
static bool add_ranked_entry(const struct model *m, cJSON *obj, int32_t id, float logprob, int32_t rank)
{
    char key[16];
    snprintf(key, sizeof key, "%d", (int)id);
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToObject(obj, key, e)) { /* obj owns e from here on */
        cJSON_Delete(e);
        return false;
    }
    if (!cJSON_AddNumberToObject(e, "logprob", lp_value(logprob)) || !cJSON_AddNumberToObject(e, "rank", rank))
        return false;
    size_t len = 0;
    char *b = token_bytes(m, id, &len);
    cJSON *s = b ? oai_json_string(b, len) : NULL;
    free(b);
    if (!s || !cJSON_AddItemToObject(e, "decoded_token", s)) {
        cJSON_Delete(s);
        return false;
    }
    return true;
}

/* vLLM's prompt_logprobs: null for the first prompt token (nothing predicts it), then per
 * token {"id": {logprob, rank, decoded_token}} for the token itself followed by its top
 * vllm_top alternatives (ranks 1..k; the token once when it is among them). */
static cJSON *vllm_prompt_logprobs(const struct model *m, const struct oai_piece *p)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr || !cJSON_AddItemToArray(arr, cJSON_CreateNull())) goto fail;
    for (int i = 0; i < p->n_plp; i++) {
        const struct req_logprob *lp = &p->plp[i];
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) { cJSON_Delete(o); goto fail; }
        if (!add_ranked_entry(m, o, lp->token, lp->logprob, lp->rank)) goto fail;
        const int k = p->vllm_top < lp->n_top ? p->vllm_top : lp->n_top;
        for (int j = 0; j < k; j++)
            if (lp->top_ids[j] != lp->token && !add_ranked_entry(m, o, lp->top_ids[j], lp->top_logprobs[j], j + 1))
                goto fail;
    }
    return arr;
fail:
    cJSON_Delete(arr);
    return NULL;
}

/* The logprobs value of a choice: null unless the piece carries logprobs. */
static cJSON *piece_logprobs(const struct model *m, enum oai_kind kind, const struct oai_piece *p)
{
    if ((!p->lp || p->n_lp <= 0) && !p->prompt_lp) return cJSON_CreateNull();
    return kind == OAI_CHAT ? chat_logprobs(m, p) : completion_logprobs(m, p);
}

/* ---------------------------------------------------------------- bodies */

/* {"id", "object", "created", "model"} */
static cJSON *meta_object(const struct oai_meta *meta, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "id", meta->id ? meta->id : "") ||
        !cJSON_AddStringToObject(o, "object", object) ||
        !cJSON_AddNumberToObject(o, "created", (double)meta->created) ||
        !cJSON_AddStringToObject(o, "model", meta->model ? meta->model : "")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *usage_object(const struct oai_usage *u)
{
    cJSON *o = cJSON_CreateObject(), *d = cJSON_CreateObject();
    if (!o || !d || !cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens) ||
        !cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens) ||
        !cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens) ||
        !cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens) ||
        !cJSON_AddItemToObject(o, "prompt_tokens_details", d)) {
        cJSON_Delete(d);
        cJSON_Delete(o);
        return NULL;
    }
    if (u->has_reasoning) {
        cJSON *cd = cJSON_AddObjectToObject(o, "completion_tokens_details");
        if (!cd || !cJSON_AddNumberToObject(cd, "reasoning_tokens", u->reasoning_tokens)) {
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

/* Frames json (malloc'd, which it frees) as one SSE event "data: <json>\n\n". */
static char *sse_frame(char *json, size_t *len)
{
    if (!json) return NULL;
    size_t n = strlen(json);
    char *out = malloc(n + 9);
    if (out) {
        memcpy(out, "data: ", 6);
        memcpy(out + 6, json, n);
        memcpy(out + 6 + n, "\n\n", 3);
        if (len) *len = n + 8;
    }
    free(json);
    return out;
}

/* Prints root (which it frees), optionally framed as one SSE event. */
static char *finish(cJSON *root, bool sse, size_t *len)
{
    char *json = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return NULL;
    if (sse) return sse_frame(json, len);
    if (len) *len = strlen(json);
    return json;
}

/* "tool_calls": [{index, id, type, function: {name, arguments}}, ...] of a message (every
 * field) or a delta (id, type and name only in a call's first delta). */
static bool add_tool_calls(cJSON *msg, const struct oai_piece *p, bool chunk)
{
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
    if (!arr) return false;
    for (int i = 0; i < p->n_calls; i++) {
        const struct oai_tool_call *tc = &p->calls[i];
        cJSON *c = cJSON_CreateObject(), *fn = NULL;
        if (!c || !cJSON_AddItemToArray(arr, c)) { cJSON_Delete(c); return false; }
        if (chunk && !cJSON_AddNumberToObject(c, "index", tc->index)) return false;
        if (tc->id && (!cJSON_AddStringToObject(c, "id", tc->id) ||
                       !cJSON_AddStringToObject(c, "type", "function")))
            return false;
        if (!(fn = cJSON_AddObjectToObject(c, "function"))) return false;
        if (tc->id && !add_text(fn, "name", tc->name ? tc->name : "", tc->name ? strlen(tc->name) : 0))
            return false;
        if (!add_text(fn, "arguments", tc->args ? tc->args : "", tc->args_len)) return false;
    }
    return true;
}

/* One choice of a chunk (delta) or a whole response (message / text). */
static cJSON *choice_object(const struct model *m, enum oai_kind kind, const struct oai_piece *p,
                            bool chunk, bool role)
{
    cJSON *c = cJSON_CreateObject();
    if (!c || !cJSON_AddNumberToObject(c, "index", p->index)) goto fail;
    const char *text = p->text ? p->text : "";
    if (kind == OAI_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (!msg) goto fail;
        if ((!chunk || role) && !cJSON_AddStringToObject(msg, "role", "assistant")) goto fail;
        if (!chunk && p->content_null && p->text_len == 0) {
            if (!cJSON_AddNullToObject(msg, "content")) goto fail;
        } else if ((!chunk || role || p->text_len > 0) && !add_text(msg, "content", text, p->text_len)) {
            goto fail;
        }
        if (p->reasoning && (p->reasoning_len > 0 || !chunk) &&
            !add_text(msg, "reasoning_content", p->reasoning, p->reasoning_len))
            goto fail;
        if (p->n_calls > 0 && !add_tool_calls(msg, p, chunk)) goto fail;
    } else if (!add_text(c, "text", text, p->text_len)) {
        goto fail;
    }
    cJSON *lp = piece_logprobs(m, kind, p);
    if (!lp || !cJSON_AddItemToObject(c, "logprobs", lp)) { cJSON_Delete(lp); goto fail; }
    if (kind != OAI_CHAT && p->vllm_prompt) { /* vLLM: per completions choice; chat: the response's */
        cJSON *plp = vllm_prompt_logprobs(m, p);
        if (!plp || !cJSON_AddItemToObject(c, "prompt_logprobs", plp)) { cJSON_Delete(plp); goto fail; }
    }
    cJSON *fr = p->finish_reason ? cJSON_CreateString(p->finish_reason) : cJSON_CreateNull();
    if (!fr || !cJSON_AddItemToObject(c, "finish_reason", fr)) { cJSON_Delete(fr); goto fail; }
    return c;
fail:
    cJSON_Delete(c);
    return NULL;
}

static const char *chunk_object_name(enum oai_kind kind)
{
    return kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion";
}

char *oai_chunk_sse(const struct model *m, const struct oai_meta *meta, const struct oai_piece *p,
                    bool role, size_t *len)
{
    cJSON *root = meta_object(meta, chunk_object_name(meta->kind));
    cJSON *choices = root ? cJSON_AddArrayToObject(root, "choices") : NULL;
    cJSON *c = choices ? choice_object(m, meta->kind, p, true, role) : NULL;
    if (!c || !cJSON_AddItemToArray(choices, c)) {
        cJSON_Delete(c);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON *usage = p->usage ? usage_object(p->usage) : NULL;
    if (p->usage && (!usage || !cJSON_AddItemToObject(root, "usage", usage))) {
        cJSON_Delete(usage);
        cJSON_Delete(root);
        return NULL;
    }
    return finish(root, true, len);
}

char *oai_usage_chunk_sse(const struct oai_meta *meta, const struct oai_usage *u, size_t *len)
{
    cJSON *root = meta_object(meta, chunk_object_name(meta->kind));
    cJSON *usage = root && cJSON_AddArrayToObject(root, "choices") ? usage_object(u) : NULL;
    if (!usage || !cJSON_AddItemToObject(root, "usage", usage)) {
        cJSON_Delete(usage);
        cJSON_Delete(root);
        return NULL;
    }
    return finish(root, true, len);
}

char *oai_error_sse(const struct api_error *e, size_t *len)
{
    return sse_frame(api_error_json(e), len);
}

char *oai_response_json(const struct model *m, const struct oai_meta *meta,
                        const struct oai_piece *pieces, int n, const struct oai_usage *u,
                        size_t *len)
{
    cJSON *root = meta_object(meta, meta->kind == OAI_CHAT ? "chat.completion" : "text_completion");
    cJSON *choices = root ? cJSON_AddArrayToObject(root, "choices") : NULL;
    if (!choices) goto fail;
    for (int i = 0; i < n; i++) {
        cJSON *c = choice_object(m, meta->kind, &pieces[i], false, true);
        if (!c || !cJSON_AddItemToArray(choices, c)) { cJSON_Delete(c); goto fail; }
    }
    cJSON *usage = usage_object(u);
    if (!usage || !cJSON_AddItemToObject(root, "usage", usage)) { cJSON_Delete(usage); goto fail; }
    if (meta->kind == OAI_CHAT && n > 0 && pieces[0].vllm_prompt) {
        cJSON *plp = vllm_prompt_logprobs(m, &pieces[0]);
        if (!plp || !cJSON_AddItemToObject(root, "prompt_logprobs", plp)) { cJSON_Delete(plp); goto fail; }
    }
    return finish(root, false, len);
fail:
    cJSON_Delete(root);
    return NULL;
}

/* The fields of one model object. */
static bool add_model(cJSON *o, const char *name, int64_t created, const char *root_name,
                      int max_model_len)
{
    return cJSON_AddStringToObject(o, "id", name) && cJSON_AddStringToObject(o, "object", "model") &&
           cJSON_AddNumberToObject(o, "created", (double)created) &&
           cJSON_AddStringToObject(o, "owned_by", "tessera") &&
           cJSON_AddStringToObject(o, "root", root_name ? root_name : name) &&
           cJSON_AddNumberToObject(o, "max_model_len", max_model_len);
}

char *oai_models_json(const char *const *names, int n, int64_t created, const char *root_name,
                      int max_model_len)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *data = root && cJSON_AddStringToObject(root, "object", "list")
                      ? cJSON_AddArrayToObject(root, "data") : NULL;
    if (!data) goto fail;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(data, o)) { cJSON_Delete(o); goto fail; }
        if (!add_model(o, names[i], created, root_name, max_model_len)) goto fail;
    }
    return finish(root, false, NULL);
fail:
    cJSON_Delete(root);
    return NULL;
}

char *oai_model_json(const char *name, int64_t created, const char *root_name, int max_model_len)
{
    cJSON *o = cJSON_CreateObject();
    if (o && add_model(o, name, created, root_name, max_model_len)) return finish(o, false, NULL);
    cJSON_Delete(o);
    return NULL;
}

/* ---------------------------------------------------------------- small things */

void oai_make_id(const char *prefix, char *buf, size_t cap)
{
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    if (!buf || cap == 0) return;
    char rnd[24];
    int got = 0;
    /* rejection sampling keeps the 62 symbols uniform: bytes >= 248 are redrawn */
    while (got < 24) {
        unsigned char r[32];
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)buf ^ (uint64_t)got;
            for (size_t i = 0; i < sizeof r; i++, x = x * 6364136223846793005ull + 1442695040888963407ull)
                r[i] = (unsigned char)(x >> 56) % 248;
        }
        for (size_t i = 0; i < sizeof r && got < 24; i++)
            if (r[i] < 248) rnd[got++] = alnum[r[i] % 62];
    }
    snprintf(buf, cap, "%s%.24s", prefix ? prefix : "", rnd);
}

const char *oai_finish_reason(enum req_finish f)
{
    switch (f) {
    case REQ_FINISH_STOP: return "stop";
    case REQ_FINISH_LENGTH: return "length";
    case REQ_FINISH_ABORT: return "abort";
    case REQ_FINISH_ERROR: return "error";
    case REQ_FINISH_NONE: break;
    }
    return NULL;
}
