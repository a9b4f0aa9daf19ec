/* error.c — the one table from project error codes (util/err.h) to an HTTP status and an
 * OpenAI error type/code, and the JSON body every error response carries:
 *   {"error":{"message":"...","type":"...","param":null|"...","code":null|"..."}}
 * Pure functions over caller-owned structs; callable from any thread at once.
 */
#include "api/error.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One row per project error code. default_code is used when the caller gives none. */
static const struct {
    int err;
    int status;
    const char *type;
    const char *default_code;
} error_table[] = {
    { ERR_INVALID,     400, API_ERR_INVALID_REQUEST, NULL },
    { ERR_FORMAT,      400, API_ERR_INVALID_REQUEST, NULL },
    { ERR_UNSUPPORTED, 400, API_ERR_INVALID_REQUEST, NULL },
    { ERR_RANGE,       400, API_ERR_INVALID_REQUEST, NULL },
    { ERR_NOT_FOUND,   404, API_ERR_NOT_FOUND,       NULL },
    { ERR_BUSY,        429, API_ERR_RATE_LIMIT,      "rate_limit_exceeded" },
    { ERR_UNAVAILABLE, 503, API_ERR_OVERLOADED,      NULL },
    { ERR_NOMEM,       500, API_ERR_SERVER,          NULL },
    { ERR_IO,          500, API_ERR_SERVER,          NULL },
};

/* Copies src (NULL → "") into dst[cap], truncating. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

struct api_error *api_error_from_code(struct api_error *e, int err_code, const char *param,
                                      const char *code, const char *message)
{
    int status = 500;
    const char *type = API_ERR_SERVER, *dcode = NULL;
    for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; i++) {
        if (error_table[i].err == err_code) {
            status = error_table[i].status;
            type = error_table[i].type;
            dcode = error_table[i].default_code;
            break;
        }
    }
    e->status = status;
    e->type = type;
    e->code = code ? code : dcode;
    copy_str(e->param, sizeof e->param, param);
    copy_str(e->message, sizeof e->message, message);
    return e;
}

struct api_error *api_error_set(struct api_error *e, int status, const char *type,
                                const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    copy_str(e->param, sizeof e->param, param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return e;
}

char *api_error_json(const struct api_error *e)
{
    return api_error_json_fields(e->message, e->type, e->param[0] ? e->param : NULL, e->code);
}

char *api_error_json_fields(const char *message, const char *type, const char *param,
                            const char *code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    char *out = NULL;
    if (!err) goto done;
    /* cJSON escapes quotes, backslashes and control characters (\n, \u0001, ...) */
    if (!cJSON_AddStringToObject(err, "message", message ? message : "")) goto done;
    if (!cJSON_AddStringToObject(err, "type", type ? type : API_ERR_SERVER)) goto done;
    if (!(param && param[0] ? cJSON_AddStringToObject(err, "param", param)
                            : cJSON_AddNullToObject(err, "param")))
        goto done;
    if (!(code && code[0] ? cJSON_AddStringToObject(err, "code", code)
                          : cJSON_AddNullToObject(err, "code")))
        goto done;
    out = cJSON_PrintUnformatted(root);
done:
    cJSON_Delete(root);
    return out;
}
