/* response_items.c — the input item list of a stored response (response_items.h). */
#define _POSIX_C_SOURCE 200809L
#include "api/response_items.h"

#include "api/openai_internal.h"
#include "util/err.h"
#include "util/query.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int resp_items_query_parse(const char *query, struct resp_items_query *q, struct api_error *e)
{
    *q = (struct resp_items_query){ .asc = false, .limit = 20 };
    char v[32];
    int got = query_get(query, "order", v, sizeof v);
    if (got && (got < 0 || (strcmp(v, "asc") && strcmp(v, "desc"))))
        return oai_bad(e, "order", "'order' must be 'asc' or 'desc'");
    q->asc = got > 0 && !strcmp(v, "asc");
    if ((got = query_get(query, "limit", v, sizeof v))) {
        char *stop;
        long n = got > 0 ? strtol(v, &stop, 10) : 0;
        if (got < 0 || !v[0] || *stop || n < 1 || n > 100)
            return oai_bad(e, "limit", "'limit' must be an integer from 1 to 100");
        q->limit = (int)n;
    }
    if (query_get(query, "after", q->after, sizeof q->after) < 0)
        return oai_bad(e, "after", "'after' must be an item id");
    return 0;
}

/* A text content part: {"type": type, "text": text} (+ "annotations": [] for output). */
static cJSON *text_part(const char *type, const char *text)
{
    cJSON *p = cJSON_CreateObject();
    if (p && cJSON_AddStringToObject(p, "type", type) && cJSON_AddStringToObject(p, "text", text) &&
        (strcmp(type, "output_text") || cJSON_AddArrayToObject(p, "annotations")))
        return p;
    cJSON_Delete(p);
    return NULL;
}

/* The item it as the Responses API types it, in place; false on OOM. */
static bool normalise(cJSON *it)
{
    if (!cJSON_IsObject(it)) return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "message";
    if (!type && !cJSON_AddStringToObject(it, "type", "message")) return false;
    if (!strcmp(t, "message")) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        bool assistant = cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (cJSON_IsString(content)) {
            cJSON *parts = cJSON_CreateArray(), *p = text_part(assistant ? "output_text" : "input_text",
                                                               content->valuestring);
            if (!parts || !p || !cJSON_AddItemToArray(parts, p)) {
                cJSON_Delete(parts);
                cJSON_Delete(p);
                return false;
            }
            cJSON_ReplaceItemInObjectCaseSensitive(it, "content", parts);
        } else if (assistant) { /* output_text parts carry annotations */
            for (cJSON *p = content ? content->child : NULL; p; p = p->next) {
                const cJSON *pt = cJSON_GetObjectItemCaseSensitive(p, "type");
                if (cJSON_IsString(pt) && !strcmp(pt->valuestring, "output_text") &&
                    !cJSON_GetObjectItemCaseSensitive(p, "annotations") && !cJSON_AddArrayToObject(p, "annotations"))
                    return false;
            }
        }
    }
    bool with_status = !strcmp(t, "message") || !strcmp(t, "function_call") || !strcmp(t, "function_call_output");
    return !with_status || cJSON_GetObjectItemCaseSensitive(it, "status") ||
           cJSON_AddStringToObject(it, "status", "completed");
}

static const char *id_of(const cJSON *it)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    return cJSON_IsString(id) ? id->valuestring : "";
}

int resp_items_list(const char *items, const struct resp_items_query *q, char **out, struct api_error *e)
{
    *out = NULL;
    cJSON *all = cJSON_Parse(items), *list = cJSON_CreateObject(), *data = NULL;
    int n = cJSON_GetArraySize(all), rc = 0;
    cJSON **v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
    if (!all || !list || !v || !cJSON_AddStringToObject(list, "object", "list") ||
        !(data = cJSON_AddArrayToObject(list, "data"))) {
        rc = oai_nomem(e);
        goto done;
    }
    int k = 0; /* v: the items in the asked order */
    for (cJSON *it = all->child; it; it = it->next) v[k++] = it;
    if (!q->asc)
        for (int i = 0; i < n / 2; i++) {
            cJSON *t = v[i];
            v[i] = v[n - 1 - i];
            v[n - 1 - i] = t;
        }
    int start = 0;
    if (q->after[0]) {
        while (start < n && strcmp(id_of(v[start]), q->after)) start++;
        if (start == n) {
            rc = oai_bad(e, "after", "'after': no input item of this response has the id '%.64s'", q->after);
            goto done;
        }
        start++;
    }
    int stop = start + q->limit < n ? start + q->limit : n;
    for (int i = start; i < stop; i++) {
        cJSON *it = cJSON_DetachItemViaPointer(all, v[i]);
        cJSON_AddItemToArray(data, it);
        if (!normalise(it)) {
            rc = oai_nomem(e);
            goto done;
        }
    }
    const cJSON *first = data->child, *last = first ? first->prev : NULL; /* cJSON: child->prev is the tail */
    if (!cJSON_AddStringToObject(list, "first_id", first ? id_of(first) : "") ||
        !cJSON_AddStringToObject(list, "last_id", last ? id_of(last) : "") ||
        !cJSON_AddBoolToObject(list, "has_more", stop < n) || !(*out = cJSON_PrintUnformatted(list)))
        rc = oai_nomem(e);
done:
    free(v);
    cJSON_Delete(all);
    cJSON_Delete(list);
    return rc;
}
