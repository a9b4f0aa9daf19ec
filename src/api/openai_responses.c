/* openai_responses.c — POST /v1/responses (OpenAI's Responses API) requests: the body is
 * checked for what only the Responses API has, then rewritten into the chat request it
 * means and parsed by the chat parser, so both endpoints share every check, the chat
 * template, tools, reasoning and structured output.
 *
 * The rewrite:
 *   instructions                  → a first "system" message
 *   previous_response_id          → that stored response's conversation items and output
 *                                   (api/response_store.h; its instructions do not carry
 *                                   over), as items before the input
 *   input: "text"                 → one "user" message
 *   input: [items]                → messages, in order:
 *     {type?: "message", role, content: "text" | [{type: input_text|output_text, text}]}
 *                                 → {role, content} (roles user/system/developer/assistant)
 *     {type: "function_call", call_id, name, arguments}
 *                                 → a tool call of the assistant message before it (its
 *                                   text or calls), else of a new one
 *     {type: "function_call_output", call_id, output}
 *                                 → {role: "tool", tool_call_id, content}
 *     {type: "reasoning", ...}    → dropped (chat templates do not replay it)
 *   max_output_tokens             → max_tokens
 *   text.format                   → response_format (text, json_object, json_schema with
 *                                   name / schema / strict / description flattened)
 *   tools: [{type: "function", name, description, parameters, strict}]
 *                                 → chat's [{type: "function", function: {...}}]
 *   tool_choice {type: "function", name} → {type: "function", function: {name}}
 *   temperature, top_p, parallel_tool_calls, stream and vLLM's extras (top_k, min_p,
 *   seed, penalties, stop, structured_outputs, guided_*, ...) as they are.
 *   include "message.output_text.logprobs" or top_logprobs > 0 → logprobs: true (and
 *                                   top_logprobs)
 * background: true → r->resp_background (the server answers at once with the queued
 *   response, or streams it, and runs it detached); it needs the store (not store: false,
 *   not a server without one).
 * Refused (400 naming the field): conversation objects and item references,
 * truncation "auto", images / files / audio in the input, and built-in tools (web_search,
 * file_search, ...); previous_response_id when the server keeps no responses (404
 * previous_response_not_found when it has no such one).
 * Stored (store: true, the default, and a server store): the conversation's items
 * (previous ones, then the input) as JSON text in r->resp_items, which the server keeps
 * with the finished response object.
 * Errors the chat parser finds are renamed to the Responses fields (messages → input,
 * max_tokens → max_output_tokens, response_format → text.format).
 *
 * The response object repeats request fields (instructions, tools, text, ...): the parser
 * keeps them as JSON text in r->resp_echo for api/responses.c.
 */
#include "api/openai_internal.h"
#include "api/response_store.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vLLM's sampling extras, passed to the chat parser unchanged. */
static const char *const PASS_THROUGH[] = {
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "stop", "ignore_eos", "min_tokens", "logit_bias",
    "bad_words", "allowed_token_ids", "cache_salt", "skip_special_tokens",
    "include_stop_str_in_output", "chat_template_kwargs", "parallel_tool_calls", "stream",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "grammar", "user", "priority",
};

/* The request fields the response object repeats, with their value when left out. */
static const char *const ECHOED[] = {
    "instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "tools",
    "parallel_tool_calls", "text", "reasoning", "metadata", "truncation", "user", "top_logprobs",
    "previous_response_id", "background",
};

/* Adds a copy of src under key to obj; false on OOM. */
static bool add_copy(cJSON *obj, const char *key, const cJSON *src)
{
    cJSON *c = cJSON_Duplicate(src, true);
    return c && cJSON_AddItemToObject(obj, key, c);
}

/* The text of a content part list ([{type: input_text|output_text|text, text}]) as chat
 * text parts into *out; param names the list for errors. */
static int content_parts(const cJSON *content, const char *param, cJSON **out, struct api_error *e)
{
    if (cJSON_IsString(content)) return (*out = cJSON_Duplicate(content, false)) ? 0 : oai_nomem(e);
    if (!cJSON_IsArray(content)) return oai_bad(e, param, "'%s' must be a string or an array of content parts", param);
    cJSON *parts = cJSON_CreateArray();
    if (!parts) return oai_nomem(e);
    int k = 0;
    for (const cJSON *p = content->child; p; p = p->next, k++) {
        const cJSON *type = oai_opt(p, "type"), *text = oai_opt(p, "text");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        int rc = 0;
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            rc = oai_bad(e, param, "'%s[%d]' must be a content part object with a 'type'", param, k);
        else if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text"))
            rc = oai_bad(e, param, "'%s[%d]': content of type '%.64s' is not supported (text only: "
                                   "'input_text' or 'output_text')", param, k, t);
        else if (!cJSON_IsString(text))
            rc = oai_bad(e, param, "'%s[%d].text' must be a string", param, k);
        cJSON *part = rc ? NULL : cJSON_CreateObject();
        if (!rc && (!part || !cJSON_AddStringToObject(part, "type", "text") ||
                    !cJSON_AddStringToObject(part, "text", text->valuestring) ||
                    !cJSON_AddItemToArray(parts, part))) {
            cJSON_Delete(part);
            rc = oai_nomem(e);
        }
        if (rc) {
            cJSON_Delete(parts);
            return rc;
        }
    }
    *out = parts;
    return 0;
}

/* Appends {role, content} to messages; content is taken (freed on failure). */
static int add_message(cJSON *messages, const char *role, cJSON *content, struct api_error *e)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToObject(m, "content", content)) {
        cJSON_Delete(content);
        cJSON_Delete(m);
        return oai_nomem(e);
    }
    if (!cJSON_AddStringToObject(m, "role", role) || !cJSON_AddItemToArray(messages, m)) {
        cJSON_Delete(m);
        return oai_nomem(e);
    }
    return 0;
}

/* A string member key of item, else 400 naming param.key. */
static const cJSON *need_string(const cJSON *item, const char *key, const char *param, struct api_error *e)
{
    const cJSON *v = oai_opt(item, key);
    if (!cJSON_IsString(v)) {
        oai_bad(e, param, "'%s.%s' must be a string", param, key);
        return NULL;
    }
    return v;
}

/* A function_call item as a tool call of the assistant message at the end of messages
 * (its text, or its calls before; else a new message with null content). */
static int add_call(cJSON *messages, const cJSON *item, const char *param, struct api_error *e)
{
    const cJSON *id = need_string(item, "call_id", param, e), *name = id ? need_string(item, "name", param, e) : NULL;
    const cJSON *args = name ? need_string(item, "arguments", param, e) : NULL;
    if (!args) return ERR_INVALID;
    cJSON *last = cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1);
    const cJSON *role = last ? cJSON_GetObjectItemCaseSensitive(last, "role") : NULL;
    cJSON *calls = NULL;
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant"))
        calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
    if (!calls && cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") &&
        !(calls = cJSON_AddArrayToObject(last, "tool_calls")))
        return oai_nomem(e);
    if (!calls) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(messages, m)) {
            cJSON_Delete(m);
            return oai_nomem(e);
        }
        if (!cJSON_AddStringToObject(m, "role", "assistant") || !cJSON_AddNullToObject(m, "content") ||
            !(calls = cJSON_AddArrayToObject(m, "tool_calls")))
            return oai_nomem(e);
    }
    cJSON *call = cJSON_CreateObject(), *fn = NULL;
    if (!call || !cJSON_AddItemToArray(calls, call)) {
        cJSON_Delete(call);
        return oai_nomem(e);
    }
    if (!cJSON_AddStringToObject(call, "id", id->valuestring) || !cJSON_AddStringToObject(call, "type", "function") ||
        !(fn = cJSON_AddObjectToObject(call, "function")) || !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
        !cJSON_AddStringToObject(fn, "arguments", args->valuestring))
        return oai_nomem(e);
    return 0;
}

/* A function_call_output item as a "tool" message. */
static int add_call_output(cJSON *messages, const cJSON *item, const char *param, struct api_error *e)
{
    const cJSON *id = need_string(item, "call_id", param, e);
    if (!id) return ERR_INVALID;
    char sub[64];
    snprintf(sub, sizeof sub, "%s.output", param);
    cJSON *content = NULL;
    const cJSON *output = oai_opt(item, "output");
    int rc = content_parts(output, sub, &content, e);
    if (rc) return rc;
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddItemToArray(messages, m)) {
        cJSON_Delete(m);
        cJSON_Delete(content);
        return oai_nomem(e);
    }
    if (!cJSON_AddItemToObject(m, "content", content)) {
        cJSON_Delete(content);
        return oai_nomem(e);
    }
    return cJSON_AddStringToObject(m, "role", "tool") && cJSON_AddStringToObject(m, "tool_call_id", id->valuestring)
               ? 0 : oai_nomem(e);
}

/* One conversation item into messages; errors name it list[i]. */
static int add_item(cJSON *messages, const cJSON *item, const char *list, int i, struct api_error *e)
{
    char param[48];
    snprintf(param, sizeof param, "%s[%d]", list, i);
    if (!cJSON_IsObject(item)) return oai_bad(e, param, "'%s' must be an object", param);
    const cJSON *type = oai_opt(item, "type");
    if (type && !cJSON_IsString(type)) return oai_bad(e, param, "'%s.type' must be a string", param);
    const char *t = type ? type->valuestring : "message";
    if (!strcmp(t, "function_call")) return add_call(messages, item, param, e);
    if (!strcmp(t, "function_call_output")) return add_call_output(messages, item, param, e);
    if (!strcmp(t, "reasoning")) return 0;
    if (!strcmp(t, "item_reference"))
        return oai_bad(e, param, "'%s': item references are not supported (send the items themselves, or "
                                 "continue a stored response with 'previous_response_id')", param);
    if (strcmp(t, "message"))
        return oai_bad(e, param, "'%s': input items of type '%.64s' are not supported", param, t);
    const cJSON *role = need_string(item, "role", param, e);
    if (!role) return ERR_INVALID;
    const char *r = role->valuestring;
    if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant"))
        return oai_bad(e, param, "'%s.role' must be 'user', 'system', 'developer' or 'assistant'", param);
    char sub[64];
    snprintf(sub, sizeof sub, "%s.content", param);
    cJSON *content = NULL;
    int rc = content_parts(oai_opt(item, "content"), sub, &content, e);
    return rc ? rc : add_message(messages, r, content, e);
}

/* Moves the elements of the JSON array text src (an entry of the store) to the end of
 * items; key: of the object src is instead, the array under that key. */
static int append_stored(cJSON *items, const char *src, const char *key, struct api_error *e)
{
    cJSON *root = cJSON_Parse(src), *list = root && key ? cJSON_GetObjectItemCaseSensitive(root, key) : root;
    if (!root) return oai_nomem(e); /* the store holds only text the server printed */
    while (cJSON_IsArray(list) && list->child)
        cJSON_AddItemToArray(items, cJSON_DetachItemViaPointer(list, list->child));
    cJSON_Delete(root);
    return 0;
}

/* previous_response_id's conversation: its items, then its output. */
static int previous_items(const struct oai_ctx *ctx, const cJSON *prev, cJSON *items, struct api_error *e)
{
    if (!cJSON_IsString(prev)) return oai_bad(e, "previous_response_id", "'previous_response_id' must be a string");
    if (!ctx->responses)
        return oai_bad(e, "previous_response_id", "'previous_response_id' needs stored responses, and this server "
                                                  "keeps none (--response-store-mb 0); send the conversation's "
                                                  "items in 'input'");
    char *response = NULL, *stored = NULL;
    int rc = resp_store_get(ctx->responses, prev->valuestring, &response, &stored);
    if (rc == ERR_NOT_FOUND) {
        api_error_set(e, 404, API_ERR_INVALID_REQUEST, "previous_response_id", "previous_response_not_found",
                      "Previous response with id '%.64s' not found.", prev->valuestring);
        return rc;
    }
    if (!rc) rc = append_stored(items, stored, NULL, e);
    if (!rc) rc = append_stored(items, response, "output", e);
    free(response);
    free(stored);
    return rc == ERR_NOMEM ? oai_nomem(e) : rc;
}

/* A stored input item without an id gets one (msg_, fc_, fco_ or rs_ by its type), so
 * that GET /v1/responses/{id}/input_items can name it: ids are how that list pages. The
 * chat conversion ignores it. */
static bool give_id(cJSON *item)
{
    if (!cJSON_IsObject(item) || cJSON_GetObjectItemCaseSensitive(item, "id")) return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "message";
    const char *prefix = !strcmp(t, "function_call") ? "fc_" : !strcmp(t, "function_call_output") ? "fco_"
                         : !strcmp(t, "reasoning") ? "rs_" : "msg_";
    char id[40];
    oai_make_id(prefix, id, sizeof id);
    return cJSON_AddStringToObject(item, "id", id) != NULL;
}

/* The conversation's items before this response's output into *out: the previous
 * response's (*n_prev of them), then the input's (a string input: one user message; each
 * with an id when the response is stored). */
static int conversation_items(const struct oai_ctx *ctx, const cJSON *root, bool stored, cJSON **out,
                              int *n_prev, struct api_error *e)
{
    const cJSON *prev = oai_opt(root, "previous_response_id"), *input = oai_opt(root, "input");
    cJSON *items = cJSON_CreateArray();
    if (!items) return oai_nomem(e);
    int rc = prev ? previous_items(ctx, prev, items, e) : 0;
    *n_prev = cJSON_GetArraySize(items);
    if (!rc && !input) rc = oai_bad(e, "input", "Missing required parameter: 'input'");
    if (!rc && cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        if (!m || !cJSON_AddItemToArray(items, m)) {
            cJSON_Delete(m);
            rc = oai_nomem(e);
        } else if (!cJSON_AddStringToObject(m, "type", "message") || !cJSON_AddStringToObject(m, "role", "user") ||
                   !cJSON_AddStringToObject(m, "content", input->valuestring)) {
            rc = oai_nomem(e);
        }
    } else if (!rc && (!cJSON_IsArray(input) || !input->child)) {
        rc = oai_bad(e, "input", "'input' must be a string or a non-empty array of input items");
    }
    for (const cJSON *it = !rc && cJSON_IsArray(input) ? input->child : NULL; it && !rc; it = it->next) {
        cJSON *c = cJSON_Duplicate(it, true);
        if (!c || !cJSON_AddItemToArray(items, c)) {
            cJSON_Delete(c);
            rc = oai_nomem(e);
        }
    }
    int i = 0;
    for (cJSON *it = stored && !rc ? items->child : NULL; it && !rc; it = it->next, i++)
        if (i >= *n_prev && !give_id(it)) rc = oai_nomem(e);
    if (rc) {
        cJSON_Delete(items);
        return rc;
    }
    *out = items;
    return 0;
}

/* instructions and the conversation's items as chat messages. */
static int build_messages(const cJSON *root, const cJSON *items, int n_prev, cJSON *chat, struct api_error *e)
{
    cJSON *messages = cJSON_AddArrayToObject(chat, "messages");
    if (!messages) return oai_nomem(e);
    const cJSON *instr = oai_opt(root, "instructions");
    if (instr && !cJSON_IsString(instr)) return oai_bad(e, "instructions", "'instructions' must be a string");
    if (instr) {
        cJSON *c = cJSON_CreateString(instr->valuestring);
        int rc = c ? add_message(messages, "system", c, e) : oai_nomem(e);
        if (rc) return rc;
    }
    int i = 0;
    for (const cJSON *it = items->child; it; it = it->next, i++) {
        int rc = i < n_prev ? add_item(messages, it, "previous_response_id", i, e)
                            : add_item(messages, it, "input", i - n_prev, e);
        if (rc) return rc;
    }
    return 0;
}

/* text.format as response_format. */
static int build_format(const cJSON *root, cJSON *chat, struct api_error *e)
{
    const cJSON *text = oai_opt(root, "text");
    if (!text) return 0;
    if (!cJSON_IsObject(text)) return oai_bad(e, "text", "'text' must be an object");
    const cJSON *fmt = oai_opt(text, "format"), *verb = oai_opt(text, "verbosity");
    if (verb && !cJSON_IsString(verb)) return oai_bad(e, "text.verbosity", "'text.verbosity' must be a string");
    if (!fmt) return 0;
    const cJSON *type = oai_opt(fmt, "type");
    if (!cJSON_IsObject(fmt) || !cJSON_IsString(type))
        return oai_bad(e, "text.format", "'text.format' must be an object with a 'type'");
    const char *t = type->valuestring;
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    if (!rf || !cJSON_AddStringToObject(rf, "type", t)) return oai_nomem(e);
    if (strcmp(t, "json_schema")) return 0; /* text / json_object; others: the chat parser's 400 */
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    if (!js) return oai_nomem(e);
    static const char *const keys[] = { "name", "schema", "strict", "description" };
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        const cJSON *v = oai_opt(fmt, keys[k]);
        if (v && !add_copy(js, keys[k], v)) return oai_nomem(e);
    }
    return 0;
}

/* tools and tool_choice in chat's nesting. */
static int build_tools(const cJSON *root, cJSON *chat, struct api_error *e)
{
    const cJSON *tools = oai_opt(root, "tools"), *tc = oai_opt(root, "tool_choice");
    if (tools) {
        if (!cJSON_IsArray(tools)) return oai_bad(e, "tools", "'tools' must be an array");
        cJSON *out = cJSON_AddArrayToObject(chat, "tools");
        if (!out) return oai_nomem(e);
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            char param[32];
            snprintf(param, sizeof param, "tools[%d]", i);
            const cJSON *type = oai_opt(t, "type");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type))
                return oai_bad(e, param, "'%s' must be an object with a 'type'", param);
            if (strcmp(type->valuestring, "function"))
                return oai_bad(e, param, "'%s': tools of type '%.64s' are not supported (only 'function')", param,
                               type->valuestring);
            cJSON *tool = cJSON_CreateObject(), *fn = NULL;
            if (!tool || !cJSON_AddItemToArray(out, tool)) {
                cJSON_Delete(tool);
                return oai_nomem(e);
            }
            if (!cJSON_AddStringToObject(tool, "type", "function") || !(fn = cJSON_AddObjectToObject(tool, "function")))
                return oai_nomem(e);
            for (const cJSON *f = t->child; f; f = f->next)
                if (strcmp(f->string, "type") && !add_copy(fn, f->string, f)) return oai_nomem(e);
        }
    }
    if (!tc) return 0;
    if (!cJSON_IsObject(tc)) return add_copy(chat, "tool_choice", tc) ? 0 : oai_nomem(e);
    const cJSON *type = oai_opt(tc, "type"), *name = oai_opt(tc, "name");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name))
        return oai_bad(e, "tool_choice", "an object 'tool_choice' must be {\"type\": \"function\", \"name\": ...}");
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice"), *fn = NULL;
    if (!c || !cJSON_AddStringToObject(c, "type", "function") || !(fn = cJSON_AddObjectToObject(c, "function")) ||
        !cJSON_AddStringToObject(fn, "name", name->valuestring))
        return oai_nomem(e);
    return 0;
}

/* What this server cannot do for a Responses request, and fields of the wrong type: 400
 * naming the field. */
static int refuse_unsupported(const cJSON *root, struct api_error *e)
{
    if (oai_opt(root, "conversation"))
        return oai_bad(e, "conversation", "'conversation' objects are not supported; continue a stored response "
                                          "with 'previous_response_id'");
    const cJSON *store = oai_opt(root, "store");
    if (store && !cJSON_IsBool(store)) return oai_bad(e, "store", "'store' must be a boolean");
    const cJSON *bg = oai_opt(root, "background");
    if (bg && !cJSON_IsBool(bg)) return oai_bad(e, "background", "'background' must be a boolean");
    const cJSON *tr = oai_opt(root, "truncation");
    if (tr && !(cJSON_IsString(tr) && !strcmp(tr->valuestring, "disabled")))
        return oai_bad(e, "truncation", "'truncation' must be 'disabled' (the input is never cut)");
    const cJSON *inc = oai_opt(root, "include");
    if (inc && !cJSON_IsArray(inc)) return oai_bad(e, "include", "'include' must be an array of strings");
    for (const cJSON *it = inc ? inc->child : NULL; it; it = it->next)
        if (!cJSON_IsString(it)) return oai_bad(e, "include", "'include' must be an array of strings");
    const cJSON *mot = oai_opt(root, "max_output_tokens");
    if (mot && (!cJSON_IsNumber(mot) || mot->valuedouble < 1 || mot->valuedouble != floor(mot->valuedouble)))
        return oai_bad(e, "max_output_tokens", "'max_output_tokens' must be an integer, at least 1");
    const cJSON *rs = oai_opt(root, "reasoning"), *md = oai_opt(root, "metadata");
    if (rs && !cJSON_IsObject(rs)) return oai_bad(e, "reasoning", "'reasoning' must be an object");
    if (md && !cJSON_IsObject(md)) return oai_bad(e, "metadata", "'metadata' must be an object");
    return 0;
}

/* background: true needs the store (a client polls GET /v1/responses/{id}, or resumes its
 * stream there). */
static int check_background(const struct oai_ctx *ctx, const cJSON *root, struct api_error *e)
{
    if (!cJSON_IsTrue(oai_opt(root, "background"))) return 0;
    if (!ctx->responses)
        return oai_bad(e, "background", "'background' responses are kept in the response store, and this server "
                                        "keeps none (--response-store-mb 0)");
    if (cJSON_IsFalse(oai_opt(root, "store")))
        return oai_bad(e, "store", "a 'background' response is stored: 'store' must not be false");
    return 0;
}

/* Logprobs: asked for by include "message.output_text.logprobs" or by top_logprobs > 0
 * (as vLLM reads it); chat's logprobs + top_logprobs. */
static int build_logprobs(const cJSON *root, cJSON *chat, struct api_error *e)
{
    const cJSON *inc = oai_opt(root, "include"), *tl = oai_opt(root, "top_logprobs");
    bool on = tl && !(cJSON_IsNumber(tl) && tl->valuedouble == 0);
    for (const cJSON *it = inc ? inc->child : NULL; it; it = it->next)
        on = on || !strcmp(it->valuestring, "message.output_text.logprobs");
    if (!on) return 0;
    if (!cJSON_AddTrueToObject(chat, "logprobs") || (tl && !add_copy(chat, "top_logprobs", tl))) return oai_nomem(e);
    return 0;
}

/* The chat request that the Responses body root means, into *out, and the conversation's
 * items into *items (stored: the response will be kept, and its input items get ids). */
static int to_chat(const struct oai_ctx *ctx, const cJSON *root, bool stored, cJSON **out, cJSON **items,
                   struct api_error *e)
{
    int n_prev = 0, rc = refuse_unsupported(root, e);
    if (!rc) rc = check_background(ctx, root, e);
    if (!rc) rc = conversation_items(ctx, root, stored, items, &n_prev, e);
    if (rc) return rc;
    cJSON *chat = cJSON_CreateObject();
    if (!chat) {
        cJSON_Delete(*items);
        *items = NULL;
        return oai_nomem(e);
    }
    for (size_t k = 0; k < sizeof PASS_THROUGH / sizeof *PASS_THROUGH && !rc; k++) {
        const cJSON *v = oai_opt(root, PASS_THROUGH[k]);
        if (v && !add_copy(chat, PASS_THROUGH[k], v)) rc = oai_nomem(e);
    }
    const cJSON *mot = oai_opt(root, "max_output_tokens");
    if (!rc && mot && !add_copy(chat, "max_tokens", mot)) rc = oai_nomem(e);
    if (!rc) rc = build_messages(root, *items, n_prev, chat, e);
    if (!rc) rc = build_format(root, chat, e);
    if (!rc) rc = build_tools(root, chat, e);
    if (!rc) rc = build_logprobs(root, chat, e);
    if (rc) {
        cJSON_Delete(chat);
        cJSON_Delete(*items);
        *items = NULL;
        return rc;
    }
    *out = chat;
    return 0;
}

/* The request fields the response repeats, and whether it is stored, as one JSON
 * object's text (malloc'd). */
static int echo_fields(const cJSON *root, bool stored, char **out, struct api_error *e)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o != NULL;
    for (size_t k = 0; ok && k < sizeof ECHOED / sizeof *ECHOED; k++) {
        const cJSON *v = oai_opt(root, ECHOED[k]);
        ok = v ? add_copy(o, ECHOED[k], v) : cJSON_AddNullToObject(o, ECHOED[k]) != NULL;
    }
    ok = ok && cJSON_AddBoolToObject(o, "store", stored);
    *out = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *out ? 0 : oai_nomem(e);
}

/* Renames a chat parameter in e to the Responses field it came from. */
static void rename_param(struct api_error *e)
{
    static const char *const map[][2] = {
        { "messages", "input" }, { "max_tokens", "max_output_tokens" }, { "response_format", "text.format" },
    };
    for (size_t k = 0; k < sizeof map / sizeof *map; k++) {
        size_t n = strlen(map[k][0]);
        if (strncmp(e->param, map[k][0], n) || (e->param[n] && e->param[n] != '[' && e->param[n] != '.')) continue;
        char rest[sizeof e->param];
        snprintf(rest, sizeof rest, "%s", e->param + n);
        snprintf(e->param, sizeof e->param, "%s%s", map[k][1], rest);
        break;
    }
    /* "'max_tokens'" in a context-length message */
    char *at = strstr(e->message, "'max_tokens'");
    if (at) {
        char rest[sizeof e->message];
        snprintf(rest, sizeof rest, "%s", at + strlen("'max_tokens'"));
        snprintf(at, sizeof e->message - (size_t)(at - e->message), "'max_output_tokens'%s", rest);
    }
}

int oai_parse_responses(const struct oai_ctx *ctx, const char *body, size_t len, struct oai_request *out,
                        struct api_error *e)
{
    memset(out, 0, sizeof *out);
    cJSON *root = oai_parse_body(body, len, e), *chat = NULL, *items = NULL;
    if (!root) return ERR_INVALID;
    bool stored = ctx->responses && !cJSON_IsFalse(oai_opt(root, "store"));
    int rc = cJSON_IsObject(root) ? to_chat(ctx, root, stored, &chat, &items, e)
                                  : oai_bad(e, NULL, "the request body must be a JSON object");
    bool background = cJSON_IsTrue(oai_opt(root, "background"));
    char *echo = NULL, *kept = NULL;
    if (!rc) rc = echo_fields(root, stored, &echo, e);
    if (!rc && stored && !(kept = cJSON_PrintUnformatted(items))) rc = oai_nomem(e);
    cJSON_Delete(root);
    cJSON_Delete(items);
    if (!rc) {
        rc = oai_parse_chat_root(ctx, chat, out, e);
        if (rc) rename_param(e);
    }
    cJSON_Delete(chat);
    if (rc) {
        free(echo);
        free(kept);
        return rc;
    }
    out->kind = OAI_RESPONSES;
    out->include_usage = true; /* the final event carries the usage */
    out->resp_echo = echo;
    out->resp_items = kept;
    out->resp_background = background;
    return 0;
}
