/* openai_tools.c — tools, tool_choice and parallel_tool_calls of chat requests, the
 * reasoning split's per-request setup, and the grammar that enforces tool_choice
 * "required" or a named function (see openai.h and openai_internal.h).
 *
 * tool_choice as vLLM and OpenAI define it:
 *   "none"      the tools reach the template; the output is not parsed for calls
 *   "auto"      (the default when tools are given) the output is parsed with the server's
 *               tool-call format; without one the request is refused, as vLLM refuses it
 *               without --enable-auto-tool-choice --tool-call-parser
 *   "required", {"type":"function","function":{"name":N}}
 *               constrained decoding makes the model call (one of) the tools, in the
 *               server's format (hermes when it has none, or when its format — deepseek_v3
 *               — puts the name outside the JSON, which one schema cannot express)
 * Pure functions; any thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/openai.h"
#include "api/openai_internal.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOOL_NAME 255 /* the output parser's limit on a called function's name */

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?}}. */
static int check_tool(const cJSON *t, int i, struct api_error *e)
{
    char param[64], msg[256];
    snprintf(param, sizeof param, "tools[%d]", i);
    const cJSON *type = oai_opt(t, "type"), *fn = oai_opt(t, "function");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type) || !cJSON_IsObject(fn)) {
        snprintf(msg, sizeof msg, "'%s' must be an object with \"type\": \"function\" and a 'function' object", param);
        return oai_bad(e, param, "%s", msg);
    }
    if (strcmp(type->valuestring, "function") != 0) {
        snprintf(msg, sizeof msg, "'%s.type' must be 'function', got '%.64s'", param, type->valuestring);
        return oai_bad(e, param, "%s", msg);
    }
    const cJSON *name = oai_opt(fn, "name"), *params = oai_opt(fn, "parameters"), *desc = oai_opt(fn, "description");
    snprintf(param, sizeof param, "tools[%d].function", i);
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > MAX_TOOL_NAME) {
        snprintf(msg, sizeof msg, "'%s.name' must be a non-empty string of at most %d bytes", param, MAX_TOOL_NAME);
        return oai_bad(e, param, "%s", msg);
    }
    if (params && !cJSON_IsObject(params)) {
        snprintf(msg, sizeof msg, "'%s.parameters' must be a JSON Schema object", param);
        return oai_bad(e, param, "%s", msg);
    }
    if (desc && !cJSON_IsString(desc)) {
        snprintf(msg, sizeof msg, "'%s.description' must be a string", param);
        return oai_bad(e, param, "%s", msg);
    }
    return 0;
}

static const cJSON *find_tool(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *n = oai_opt(oai_opt(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return t;
    }
    return NULL;
}

/* The format forced calls are written in (see the file comment). */
static enum tparse_format forced_format(enum tparse_format f)
{
    return f == TP_NONE || f == TP_DEEPSEEK_V3 ? TP_HERMES : f;
}

int oai_tool_grammar_spec(const cJSON *tools, const char *name, enum tparse_format fmt,
                          bool parallel, struct grammar_spec *spec, char **schema)
{
    *schema = NULL;
    const char *key = tparse_format_args_key(fmt);
    cJSON *root = cJSON_CreateObject(), *any = cJSON_AddArrayToObject(root, "anyOf");
    int rc = ERR_NOMEM;
    if (!any) goto fail;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = oai_opt(t, "function"), *n = oai_opt(fn, "name"), *params = oai_opt(fn, "parameters");
        if (name && strcmp(n->valuestring, name) != 0) continue;
        cJSON *branch = cJSON_CreateObject();
        if (!branch || !cJSON_AddItemToArray(any, branch)) { cJSON_Delete(branch); goto fail; }
        cJSON *props = NULL, *nm = NULL, *req = NULL;
        if (!cJSON_AddStringToObject(branch, "type", "object") ||
            !(props = cJSON_AddObjectToObject(branch, "properties")) ||
            !(nm = cJSON_AddObjectToObject(props, "name")) ||
            !cJSON_AddStringToObject(nm, "const", n->valuestring))
            goto fail;
        cJSON *p = params ? cJSON_Duplicate(params, 1) : cJSON_CreateObject();
        if (!p || !cJSON_AddItemToObject(props, key, p)) { cJSON_Delete(p); goto fail; }
        if (!params && !cJSON_AddStringToObject(p, "type", "object")) goto fail;
        if (!(req = cJSON_AddArrayToObject(branch, "required")) ||
            !cJSON_AddItemToArray(req, cJSON_CreateString("name")) ||
            !cJSON_AddItemToArray(req, cJSON_CreateString(key)))
            goto fail;
    }
    if (cJSON_GetArraySize(any) == 0) {
        rc = ERR_NOT_FOUND;
        goto fail;
    }
    if (!(*schema = cJSON_PrintUnformatted(root))) goto fail;
    cJSON_Delete(root);
    *spec = (struct grammar_spec){ .kind = GRAMMAR_JSON_SCHEMA, .text = *schema,
                                   .text_len = strlen(*schema), .min_items = 1,
                                   .max_items = parallel ? 0 : 1 };
    switch (fmt) {
    case TP_LLAMA3_JSON:
        spec->prefix = "";
        spec->suffix = "";
        spec->separator = "; ";
        break;
    case TP_MISTRAL:
        spec->prefix = "[TOOL_CALLS][";
        spec->suffix = "]";
        spec->separator = "";
        break;
    default:
        spec->prefix = "<tool_call>\n";
        spec->suffix = "\n</tool_call>";
        spec->separator = "\n";
        break;
    }
    return 0;
fail:
    cJSON_Delete(root);
    return rc;
}

/* The one place a forced call's grammar joins the request: compiled and owned by the
 * request as any structured output (openai_structured.c). */
static int attach_tool_grammar(const struct oai_ctx *ctx, struct oai_request *r,
                               const struct grammar_spec *spec, struct api_error *e)
{
    return oai_attach_grammar(ctx, r, spec, "tool_choice", e);
}

int oai_parse_tools(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r,
                    struct api_error *e)
{
    const cJSON *tools = oai_opt(root, "tools"), *tc = oai_opt(root, "tool_choice");
    const cJSON *ptc = oai_opt(root, "parallel_tool_calls");
    int rc;
    if (tools && !cJSON_IsArray(tools)) return oai_bad(e, "tools", "'tools' must be an array");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        if ((rc = check_tool(t, i++, e))) return rc;
    }
    bool has_tools = tools && cJSON_GetArraySize(tools) > 0;
    if (ptc && !cJSON_IsBool(ptc))
        return oai_bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    bool parallel = !ptc || cJSON_IsTrue(ptc);
    r->max_tool_calls = parallel ? 0 : 1;

    const char *forced_name = NULL;
    bool forced = false;
    if (!tc) {
        tc = NULL; /* "auto" with tools, else "none" */
    } else if (cJSON_IsString(tc)) {
        const char *v = tc->valuestring;
        if (!strcmp(v, "none")) return 0;
        if (!strcmp(v, "required")) forced = true;
        else if (strcmp(v, "auto") != 0)
            return oai_bad(e, "tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (cJSON_IsObject(tc)) {
        const cJSON *type = oai_opt(tc, "type"), *fn = oai_opt(tc, "function");
        const cJSON *name = cJSON_IsObject(fn) ? oai_opt(fn, "name") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
            return oai_bad(e, "tool_choice", "a named 'tool_choice' must be {\"type\": \"function\", "
                                         "\"function\": {\"name\": \"...\"}}");
        forced = true;
        forced_name = name->valuestring;
    } else {
        return oai_bad(e, "tool_choice", "'tool_choice' must be a string or an object");
    }
    if (!has_tools) {
        if (!forced) return 0; /* "auto" without tools: nothing to call */
        return oai_bad(e, "tool_choice", "'tool_choice' other than 'none' or 'auto' requires 'tools'");
    }
    if (forced_name && !find_tool(tools, forced_name)) {
        api_error_set(e, 400, API_ERR_INVALID_REQUEST, "tool_choice", NULL,
                      "'tool_choice' names the function '%.128s', which is not in 'tools'", forced_name);
        return ERR_INVALID;
    }
    if (!forced) {
        if (ctx->tool_format == TP_NONE)
            return oai_bad(e, "tool_choice",
                       "\"auto\" tool choice requires the server to parse tool calls: start it "
                       "with --tool-call-parser (hermes, llama3_json, mistral or deepseek_v3; "
                       "--enable-auto-tool-choice is accepted too), or send \"tool_choice\": "
                       "\"none\" to render the tools into the prompt only");
        r->tool_format = ctx->tool_format;
    } else {
        r->tool_format = forced_format(ctx->tool_format);
        r->tool_forced = true;
        struct grammar_spec spec;
        rc = oai_tool_grammar_spec(tools, forced_name, r->tool_format, parallel, &spec, &r->tool_schema);
        if (rc == ERR_NOMEM) return oai_nomem(e);
        if (rc) return oai_bad(e, "tool_choice", "'tool_choice' names no function in 'tools'");
        if ((rc = attach_tool_grammar(ctx, r, &spec, e))) return rc;
    }
    /* these formats' markers are special tokens, which the text must keep (as vLLM does) */
    if (r->tool_format == TP_MISTRAL || r->tool_format == TP_DEEPSEEK_V3)
        r->rp.skip_special_tokens = false;
    return 0;
}

void oai_parse_reasoning(const struct oai_ctx *ctx, const cJSON *root, struct oai_request *r)
{
    /* forced calls are all the output there is: nothing to split off; and a template
       told not to think (Qwen3's enable_thinking=false) gets an answer without reasoning */
    const cJSON *think = oai_opt(oai_opt(root, "chat_template_kwargs"), "enable_thinking");
    r->reasoning = r->kind == OAI_CHAT && !r->tool_forced && !cJSON_IsFalse(think)
                       ? ctx->reasoning : RSN_NONE;
    r->reasoning_opened = false;
    if (r->reasoning == RSN_NONE || !ctx->m || !ctx->m->tok) return;
    /* the text of the prompt's last few tokens is enough to see "<think>\n" */
    char tail[256];
    size_t n = 0;
    for (int i = r->n_prompt > 8 ? r->n_prompt - 8 : 0; i < r->n_prompt; i++) {
        int len = tok_token_bytes(ctx->m->tok, r->prompt_ids[i], false, NULL, 0);
        if (len <= 0) continue;
        if (n + (size_t)len > sizeof tail) n = 0; /* keep the end */
        if ((size_t)len > sizeof tail) continue;
        tok_token_bytes(ctx->m->tok, r->prompt_ids[i], false, tail + n, len);
        n += (size_t)len;
    }
    r->reasoning_opened = rsn_prompt_opens(tail, n);
}

void oai_defer_grammar_for_reasoning(const struct oai_ctx *ctx, struct oai_request *r)
{
    if (!r->grammar || r->reasoning == RSN_NONE) return;
    int id = ctx->m && ctx->m->tok ? tok_find(ctx->m->tok, "</think>") : -1;
    if (id >= 0) {
        r->rp.grammar_deferred = true;
        r->rp.grammar_start_token = id;
    } else {
        r->reasoning = RSN_NONE;
    }
}

int oai_output_parser(const struct oai_request *r, struct tparse *p, tparse_emit_fn emit, void *ud)
{
    return tparse_init(p, r->tool_format, r->max_tool_calls, r->reasoning, r->reasoning_opened,
                       emit, ud);
}

/* True if the template renders a call's arguments with tojson (it wants an object). */
static bool template_wants_object_args(const char *src)
{
    for (const char *s = src ? strstr(src, "arguments") : NULL; s; s = strstr(s + 1, "arguments")) {
        const char *q = s + strlen("arguments");
        while (*q == ' ') q++;
        if (*q++ != '|') continue;
        while (*q == ' ') q++;
        if (!strncmp(q, "tojson", 6)) return true;
    }
    return false;
}

/* The content a template sees for a message that gives none (null, or absent beside tool
 * calls): null when the message carries calls and the template reads tool_calls (it renders
 * them, and some test `content is none` to choose that branch: R1-Distill's), else "" (as
 * vLLM renders it; a template that cannot show the calls would only fail on a null). */
static bool content_stays_null(const cJSON *msg, bool template_reads_calls)
{
    const cJSON *calls = oai_opt(msg, "tool_calls");
    return template_reads_calls && cJSON_GetArraySize(calls) > 0;
}

/* True if msg needs a change before the template sees it: content null or absent (and not
 * to stay null), or a tool_calls that is null or empty (dropped, as vLLM drops it, so that
 * the template takes its plain-message path). */
static bool message_needs_normalizing(const cJSON *msg, bool template_reads_calls)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (calls && (cJSON_IsNull(calls) || cJSON_GetArraySize(calls) == 0)) return true;
    if (content && !cJSON_IsNull(content)) return false;
    return !content_stays_null(msg, template_reads_calls) || !content;
}

static int normalize_message(cJSON *msg, bool template_reads_calls)
{
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (calls && (cJSON_IsNull(calls) || cJSON_GetArraySize(calls) == 0))
        cJSON_DeleteItemFromObjectCaseSensitive(msg, "tool_calls");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (content && !cJSON_IsNull(content)) return 0;
    cJSON *v = content_stays_null(msg, template_reads_calls) ? cJSON_CreateNull() : cJSON_CreateString("");
    if (!v) return ERR_NOMEM;
    if (content) cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", v);
    else cJSON_AddItemToObject(msg, "content", v);
    return 0;
}

/* String arguments holding a JSON object become that object (others stay as sent). */
static void parse_string_arguments(cJSON *msg)
{
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (!cJSON_IsArray(calls)) return;
    cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(args)) continue;
        cJSON *obj = cJSON_Parse(args->valuestring);
        if (!cJSON_IsObject(obj)) { /* not an object: left as the client sent it */
            cJSON_Delete(obj);
            continue;
        }
        cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
    }
}

int oai_messages_for_template(const struct model *m, const cJSON *messages, cJSON **copy,
                              struct api_error *e)
{
    *copy = NULL;
    if (!cJSON_IsArray(messages)) return 0; /* chat_validate_messages says what is wrong */
    const char *src = m ? m->chat_template : NULL;
    bool convert = template_wants_object_args(src), reads_calls = src && strstr(src, "tool_calls");
    bool any_args = false, any_normalize = false;
    char param[96], msg[256];
    int i = 0;
    const cJSON *msg_it;
    cJSON_ArrayForEach(msg_it, messages) {
        if (!cJSON_IsObject(msg_it)) { i++; continue; }
        any_normalize |= message_needs_normalizing(msg_it, reads_calls);
        const cJSON *calls = oai_opt(msg_it, "tool_calls");
        if (!calls) { i++; continue; }
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        if (!cJSON_IsArray(calls)) {
            snprintf(msg, sizeof msg, "'%s' must be an array", param);
            return oai_bad(e, param, "%s", msg);
        }
        int j = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, calls) {
            const cJSON *fn = cJSON_IsObject(c) ? oai_opt(c, "function") : NULL;
            const cJSON *name = cJSON_IsObject(fn) ? oai_opt(fn, "name") : NULL;
            const cJSON *args = cJSON_IsObject(fn) ? oai_opt(fn, "arguments") : NULL;
            if (!cJSON_IsString(name) || (args && !cJSON_IsString(args) && !cJSON_IsObject(args))) {
                snprintf(msg, sizeof msg, "'%s[%d]' must be {\"id\", \"type\": \"function\", "
                         "\"function\": {\"name\": string, \"arguments\": string}}", param, j);
                return oai_bad(e, param, "%s", msg);
            }
            any_args |= cJSON_IsString(args);
            j++;
        }
        i++;
    }
    if (!(convert && any_args) && !any_normalize) return 0;
    if (!(*copy = cJSON_Duplicate(messages, 1))) return oai_nomem(e);
    cJSON *mi;
    cJSON_ArrayForEach(mi, *copy) {
        if (!cJSON_IsObject(mi)) continue;
        if (normalize_message(mi, reads_calls)) {
            cJSON_Delete(*copy);
            *copy = NULL;
            return oai_nomem(e);
        }
        if (convert) parse_string_arguments(mi);
    }
    return 0;
}
