/* chat.c — conversation → prompt text via the model's chat template (see chat.h). */
#define _POSIX_C_SOURCE 200809L
#include "chat/chat.h"
#include "template/jinja.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const known_roles[] = { "system", "user", "assistant", "tool", "developer" };

static int role_known(const char *r)
{
    for (size_t i = 0; i < sizeof known_roles / sizeof known_roles[0]; i++)
        if (!strcmp(r, known_roles[i])) return 1;
    return 0;
}

static int content_valid(const cJSON *content, int i, char *err, size_t errlen)
{
    if (cJSON_IsString(content) || cJSON_IsNull(content)) return 0;
    if (!cJSON_IsArray(content))
        return err_set(err, errlen, ERR_INVALID, "messages[%d].content must be a string or an array of content parts", i);
    int j = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return err_set(err, errlen, ERR_INVALID, "messages[%d].content[%d] must be an object with a string 'type'", i, j);
        if (strcmp(type->valuestring, "text") != 0)
            return err_set(err, errlen, ERR_INVALID, "messages[%d].content[%d].type '%s' is not supported (only 'text')", i, j, type->valuestring);
        if (!cJSON_IsString(text))
            return err_set(err, errlen, ERR_INVALID, "messages[%d].content[%d].text must be a string", i, j);
        j++;
    }
    return 0;
}

int chat_validate_messages(const cJSON *messages, char *err, size_t errlen)
{
    if (!cJSON_IsArray(messages)) return err_set(err, errlen, ERR_INVALID, "messages must be an array");
    if (cJSON_GetArraySize(messages) == 0) return err_set(err, errlen, ERR_INVALID, "messages must not be empty");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m)) return err_set(err, errlen, ERR_INVALID, "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) return err_set(err, errlen, ERR_INVALID, "messages[%d].role must be a string", i);
        if (!role_known(role->valuestring))
            return err_set(err, errlen, ERR_INVALID, "messages[%d].role '%s' is not one of system, user, assistant, tool, developer", i, role->valuestring);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content) {
            if (!cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
                return err_set(err, errlen, ERR_INVALID, "messages[%d].content is missing", i);
        } else {
            int rc = content_valid(content, i, err, errlen);
            if (rc) return rc;
        }
        i++;
    }
    return 0;
}

char *chat_content_text(const cJSON *message)
{
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(message, "content");
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    size_t total = 1;
    const cJSON *part;
    if (cJSON_IsArray(content))
        cJSON_ArrayForEach(part, content) total += strlen(cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring) + 1;
    char *buf = malloc(total);
    if (!buf) return NULL;
    size_t n = 0;
    int first = 1;
    if (cJSON_IsArray(content))
        cJSON_ArrayForEach(part, content) {
            const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
            if (!first) buf[n++] = '\n';
            size_t l = strlen(t);
            memcpy(buf + n, t, l);
            n += l;
            first = 0;
        }
    buf[n] = 0;
    return buf;
}

/* Content given as text parts is flattened to one string (parts joined with "\n", as
 * vLLM does for text-only models), so every template sees the plain-string form. */
static cJSON *flatten_messages(const cJSON *messages)
{
    cJSON *copy = cJSON_Duplicate(messages, 1);
    if (!copy) return NULL;
    cJSON *m;
    cJSON_ArrayForEach(m, copy) {
        if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "content"))) continue;
        char *text = chat_content_text(m);
        cJSON *s = text ? cJSON_CreateString(text) : NULL;
        free(text);
        if (!s) { cJSON_Delete(copy); return NULL; }
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", s);
    }
    return copy;
}

int chat_render(const struct jinja_template *tpl, const struct chat_specials *sp,
                const cJSON *messages, const cJSON *tools, const cJSON *extra,
                bool add_generation_prompt, char **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    int rc = chat_validate_messages(messages, err, errlen);
    if (rc) return rc;
    cJSON *ctx = cJSON_CreateObject();
    cJSON *msgs = flatten_messages(messages);
    if (!ctx || !msgs) {
        cJSON_Delete(ctx);
        cJSON_Delete(msgs);
        return err_set(err, errlen, ERR_NOMEM, "out of memory building the chat context");
    }
    cJSON_AddItemToObject(ctx, "messages", msgs);
    cJSON_AddItemToObject(ctx, "tools", tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull());
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
    cJSON_AddStringToObject(ctx, "bos_token", sp->bos_token ? sp->bos_token : "");
    cJSON_AddStringToObject(ctx, "eos_token", sp->eos_token ? sp->eos_token : "");
    if (extra) {
        const cJSON *item;
        cJSON_ArrayForEach(item, extra) {
            cJSON_DeleteItemFromObjectCaseSensitive(ctx, item->string);
            cJSON_AddItemToObject(ctx, item->string, cJSON_Duplicate(item, 1));
        }
    }
    struct jinja_render_opts opts = { 0, NULL };
    rc = jinja_render(tpl, ctx, &opts, out, out_len, err, errlen);
    cJSON_Delete(ctx);
    return rc;
}
