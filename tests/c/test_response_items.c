/* test_response_items.c — GET /v1/responses/{id}/input_items on its own
 * (src/api/response_items.h): the query (order, limit, after with percent-escapes; bad
 * values named), the items typed as the Responses API types them (string content as one
 * part, output_text with annotations, statuses), both orders, pages by limit and after,
 * an empty page past the end, an unknown 'after'.
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "api/response_items.h"
#include "util/err.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char ITEMS[] =
    "[{\"type\":\"message\",\"role\":\"user\",\"content\":\"Hi\",\"id\":\"msg_1\"},"
    "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello\"}],"
    "\"status\":\"incomplete\"},"
    "{\"type\":\"function_call\",\"id\":\"fc_3\",\"call_id\":\"call_a\",\"name\":\"f\",\"arguments\":\"{}\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"1\",\"id\":\"fco_4\"},"
    "{\"role\":\"assistant\",\"content\":\"Done.\",\"id\":\"msg_5\"},"
    "{\"type\":\"reasoning\",\"id\":\"rs_6\",\"summary\":[]}]";

static cJSON *list_of(const char *query)
{
    struct resp_items_query q;
    struct api_error e;
    CHECK(resp_items_query_parse(query, &q, &e) == 0, "query %s: %s", query, e.message);
    char *out = NULL;
    int rc = resp_items_list(ITEMS, &q, &out, &e);
    CHECK(rc == 0 && out, "list %s: %d", query, rc);
    cJSON *r = out ? cJSON_Parse(out) : NULL;
    free(out);
    return r;
}

/* "id,id,...|first|last|has_more" of a list. */
static void ids_of(const cJSON *r, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(r, "data");
    for (const cJSON *it = d ? d->child : NULL; it; it = it->next)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "," : "",
                              cJSON_GetObjectItemCaseSensitive(it, "id")->valuestring);
    snprintf(buf + n, cap - n, "|%s|%s|%s", cJSON_GetObjectItemCaseSensitive(r, "first_id")->valuestring,
             cJSON_GetObjectItemCaseSensitive(r, "last_id")->valuestring,
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "has_more")) ? "more" : "end");
}

static void test_query(void)
{
    struct resp_items_query q;
    struct api_error e;
    CHECK(resp_items_query_parse("", &q, &e) == 0 && !q.asc && q.limit == 20 && !q.after[0], "defaults");
    CHECK(resp_items_query_parse(NULL, &q, &e) == 0 && q.limit == 20, "no query");
    CHECK(resp_items_query_parse("include%5B%5D=message.output_text.logprobs&order=asc&limit=100&after=msg%5Fx+y",
                                 &q, &e) == 0 && q.asc && q.limit == 100 && !strcmp(q.after, "msg_x y"),
          "all keys: %s", q.after);
    static const char *const bad[][2] = {
        { "limit=0", "limit" }, { "limit=101", "limit" }, { "limit=", "limit" }, { "limit=3x", "limit" },
        { "order=ASC", "order" }, { "order", "order" }, { "after=%00", "after" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = resp_items_query_parse(bad[i][0], &q, &e);
        CHECK(rc == ERR_INVALID && e.status == 400 && !strcmp(e.param, bad[i][1]), "%s -> %d %s", bad[i][0], rc,
              e.param);
    }
    char longer[300] = "after=";
    memset(longer + 6, 'a', 200);
    CHECK(resp_items_query_parse(longer, &q, &e) == ERR_INVALID, "an 'after' longer than any id");
}

static void test_items_typed(void)
{
    cJSON *r = list_of("order=asc");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(r, "data");
    CHECK(cJSON_GetArraySize(d) == 6, "all six");
    char *s = cJSON_PrintUnformatted(cJSON_GetArrayItem(d, 0));
    CHECK(s && strstr(s, "\"content\":[{\"type\":\"input_text\",\"text\":\"Hi\"}]") && strstr(s, "\"status\":\"completed\""),
          "a string user message: %s", s);
    free(s);
    s = cJSON_PrintUnformatted(cJSON_GetArrayItem(d, 1));
    CHECK(s && strstr(s, "\"annotations\":[]") && strstr(s, "\"status\":\"incomplete\""), "an output message: %s", s);
    free(s);
    s = cJSON_PrintUnformatted(cJSON_GetArrayItem(d, 4));
    CHECK(s && strstr(s, "\"type\":\"message\"") &&
              strstr(s, "[{\"type\":\"output_text\",\"text\":\"Done.\",\"annotations\":[]}]"),
          "an assistant string message without a type: %s", s);
    free(s);
    CHECK(!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(d, 2), "status")->valuestring, "completed") &&
              !strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(d, 3), "status")->valuestring, "completed"),
          "calls and outputs completed");
    CHECK(!cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(d, 5), "status"), "reasoning items have no status");
    cJSON_Delete(r);
}

static void test_pages(void)
{
    static const char *const cases[][2] = {
        { "", "rs_6,msg_5,fco_4,fc_3,msg_2,msg_1|rs_6|msg_1|end" },
        { "order=asc", "msg_1,msg_2,fc_3,fco_4,msg_5,rs_6|msg_1|rs_6|end" },
        { "limit=2", "rs_6,msg_5|rs_6|msg_5|more" },
        { "limit=2&after=msg_5", "fco_4,fc_3|fco_4|fc_3|more" },
        { "limit=2&after=fc_3", "msg_2,msg_1|msg_2|msg_1|end" },
        { "order=asc&after=fco_4", "msg_5,rs_6|msg_5|rs_6|end" },
        { "after=msg_1", "|||end" },
    };
    char got[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *r = list_of(cases[i][0]);
        if (!r) continue;
        ids_of(r, got, sizeof got);
        CHECK(!strcmp(got, cases[i][1]), "%s: %s, want %s", cases[i][0], got, cases[i][1]);
        cJSON_Delete(r);
    }
    struct resp_items_query q;
    struct api_error e;
    char *out = NULL;
    resp_items_query_parse("after=msg_9", &q, &e);
    CHECK(resp_items_list(ITEMS, &q, &out, &e) == ERR_INVALID && !out && !strcmp(e.param, "after"), "unknown after");
    resp_items_query_parse("", &q, &e);
    CHECK(resp_items_list("[]", &q, &out, &e) == 0 && out && !strcmp(out, "{\"object\":\"list\",\"data\":[],"
                                                                       "\"first_id\":\"\",\"last_id\":\"\","
                                                                       "\"has_more\":false}"),
          "no items: %s", out ? out : "(null)");
    free(out);
}

int main(void)
{
    RUN(test_query);
    RUN(test_items_typed);
    RUN(test_pages);
    return test_summary();
}
