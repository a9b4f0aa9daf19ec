/* test_api_error.c — api/error: the error-code table and the OpenAI error JSON shape. */
#include "test.h"
#include "api/error.h"
#include "util/err.h"

#include <cjson/cJSON.h>

/* Parses json and returns its "error" object (owned by *root). */
static const cJSON *parse_error(const char *json, cJSON **root)
{
    *root = json ? cJSON_Parse(json) : NULL;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(*root, "error");
    return cJSON_IsObject(e) ? e : NULL;
}

static const char *str_field(const cJSON *e, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void test_table(void)
{
    static const struct {
        int err;
        int status;
        const char *type;
        const char *code; /* expected code when the caller passes none */
    } cases[] = {
        { ERR_INVALID, 400, API_ERR_INVALID_REQUEST, NULL },
        { ERR_FORMAT, 400, API_ERR_INVALID_REQUEST, NULL },
        { ERR_UNSUPPORTED, 400, API_ERR_INVALID_REQUEST, NULL },
        { ERR_RANGE, 400, API_ERR_INVALID_REQUEST, NULL },
        { ERR_NOT_FOUND, 404, API_ERR_NOT_FOUND, NULL },
        { ERR_BUSY, 429, API_ERR_RATE_LIMIT, "rate_limit_exceeded" },
        { ERR_UNAVAILABLE, 503, API_ERR_OVERLOADED, NULL },
        { ERR_NOMEM, 500, API_ERR_SERVER, NULL },
        { ERR_IO, 500, API_ERR_SERVER, NULL },
        { -1234, 500, API_ERR_SERVER, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct api_error e;
        api_error_from_code(&e, cases[i].err, NULL, NULL, "m");
        CHECK(e.status == cases[i].status, "err %d: status %d", cases[i].err, e.status);
        CHECK(strcmp(e.type, cases[i].type) == 0, "err %d: type %s", cases[i].err, e.type);
        CHECK(cases[i].code ? e.code && strcmp(e.code, cases[i].code) == 0 : e.code == NULL,
              "err %d: code %s", cases[i].err, e.code ? e.code : "(null)");
        CHECK(e.param[0] == 0 && strcmp(e.message, "m") == 0, "err %d: param/message",
              cases[i].err);
    }
    struct api_error e;
    api_error_from_code(&e, ERR_RANGE, "messages", "context_length_exceeded", "too long");
    CHECK(e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0, "range code");
    CHECK(strcmp(e.param, "messages") == 0, "param %s", e.param);
    api_error_from_code(&e, ERR_NOT_FOUND, "model", "model_not_found", "no such model");
    CHECK(e.status == 404 && strcmp(e.code, "model_not_found") == 0, "model_not_found");
}

static void test_set_truncates(void)
{
    struct api_error e;
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    api_error_set(&e, 400, API_ERR_INVALID_REQUEST, big, NULL, "%s", big);
    CHECK(strlen(e.message) == sizeof e.message - 1, "message truncated to %zu", strlen(e.message));
    CHECK(strlen(e.param) == sizeof e.param - 1, "param truncated to %zu", strlen(e.param));
    api_error_set(&e, 429, API_ERR_RATE_LIMIT, NULL, "rate_limit_exceeded", "queue has %d", 7);
    CHECK(e.status == 429 && strcmp(e.message, "queue has 7") == 0, "formatted: %s", e.message);
}

static void test_json_shape(void)
{
    struct api_error e;
    api_error_set(&e, 400, API_ERR_INVALID_REQUEST, NULL, NULL, "bad");
    char *json = api_error_json(&e);
    CHECK(json && strcmp(json, "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\","
                               "\"param\":null,\"code\":null}}") == 0,
          "json %s", json ? json : "(null)");
    free(json);

    api_error_set(&e, 400, API_ERR_INVALID_REQUEST, "messages[1].role", "invalid_value", "x");
    cJSON *root;
    json = api_error_json(&e);
    const cJSON *err = parse_error(json, &root);
    CHECK(err != NULL, "parses: %s", json ? json : "(null)");
    CHECK(str_field(err, "param") && strcmp(str_field(err, "param"), "messages[1].role") == 0,
          "param");
    CHECK(str_field(err, "code") && strcmp(str_field(err, "code"), "invalid_value") == 0, "code");
    CHECK(cJSON_GetArraySize(err) == 4, "exactly four fields");
    cJSON_Delete(root);
    free(json);

    /* empty param/code strings are null too */
    json = api_error_json_fields("m", API_ERR_SERVER, "", "");
    err = parse_error(json, &root);
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(err, "param")), "empty param → null");
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(err, "code")), "empty code → null");
    cJSON_Delete(root);
    free(json);
}

static void test_json_escaping(void)
{
    const char *msg = "say \"hi\"\nback\\slash\ttab\x01\x1f end";
    char *json = api_error_json_fields(msg, API_ERR_INVALID_REQUEST, "p\"q", NULL);
    CHECK(json != NULL, "json");
    if (!json) return;
    /* no raw control characters or unescaped quotes inside the text */
    for (const char *p = json; *p; p++) CHECK((unsigned char)*p >= 0x20, "raw control 0x%02x", *p);
    CHECK(strstr(json, "\\\"hi\\\"") && strstr(json, "\\n") && strstr(json, "\\\\slash") &&
              strstr(json, "\\t") && strstr(json, "\\u0001") && strstr(json, "\\u001f"),
          "escapes: %s", json);
    cJSON *root;
    const cJSON *err = parse_error(json, &root);
    CHECK(str_field(err, "message") && strcmp(str_field(err, "message"), msg) == 0,
          "round trip");
    CHECK(str_field(err, "param") && strcmp(str_field(err, "param"), "p\"q") == 0, "param trip");
    cJSON_Delete(root);
    free(json);

    json = api_error_json_fields(NULL, NULL, NULL, NULL);
    err = parse_error(json, &root);
    CHECK(str_field(err, "message") && str_field(err, "message")[0] == 0, "NULL message → \"\"");
    CHECK(str_field(err, "type") != NULL, "NULL type → a type");
    cJSON_Delete(root);
    free(json);
}

int main(void)
{
    RUN(test_table);
    RUN(test_set_truncates);
    RUN(test_json_shape);
    RUN(test_json_escaping);
    return test_summary();
}
