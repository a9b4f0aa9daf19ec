/* test_responses.c — the Responses API's output (src/api/responses.h) on its own: output
 * parser events that switch kinds (reasoning → text → two tool calls) become the items
 * and, streaming, exactly OpenAI's event sequence (types, sequence numbers, output
 * indices, item ids), with the final response repeating the done items; collected
 * without a sink the same items form the whole response; statuses (a background
 * response's queued / in_progress snapshots and its cancelled end) and errors; text
 * that is not valid UTF-8 still gives valid JSON.
 */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include "api/responses.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define MAX_EVENTS 64

struct sink {
    cJSON *ev[MAX_EVENTS];
    char type[MAX_EVENTS][64];
    int n;
    int bad; /* events not framed as "event: T\ndata: {json with type T}\n\n" */
};

static void collect(void *ud, char *sse)
{
    struct sink *s = ud;
    const char *nl = sse ? strchr(sse, '\n') : NULL;
    size_t len = sse ? strlen(sse) : 0;
    if (!sse || strncmp(sse, "event: ", 7) || !nl || strncmp(nl + 1, "data: ", 6) || len < 2 ||
        strcmp(sse + len - 2, "\n\n") || s->n == MAX_EVENTS) {
        s->bad++;
        free(sse);
        return;
    }
    snprintf(s->type[s->n], sizeof s->type[0], "%.*s", (int)(nl - sse - 7), sse + 7);
    cJSON *ev = cJSON_Parse(nl + 7);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ev, "type");
    if (!cJSON_IsString(t) || strcmp(t->valuestring, s->type[s->n])) s->bad++;
    s->ev[s->n++] = ev;
    free(sse);
}

static void sink_free(struct sink *s)
{
    for (int i = 0; i < s->n; i++) cJSON_Delete(s->ev[i]);
}

static const struct resp_meta META = {
    .id = "resp_test", .created_at = 1700000000, .model = "smol",
    .echo = "{\"instructions\":\"Be brief.\",\"tools\":null,\"tool_choice\":null,\"text\":null,"
            "\"max_output_tokens\":64}",
    .top_logprobs = -1,
};

static int feed(struct resp_out *o, enum tparse_event_kind k, const char *text, const char *id,
                const char *name)
{
    struct tparse_event ev = { .kind = k, .text = text, .len = text ? strlen(text) : 0, .id = id, .name = name };
    return resp_out_event(o, &ev);
}

/* reasoning, an empty content event, text, then two calls */
static void feed_all(struct resp_out *o)
{
    CHECK(feed(o, TP_EV_REASONING, "Let me", NULL, NULL) == 0, "feed");
    CHECK(feed(o, TP_EV_REASONING, " think.", NULL, NULL) == 0, "feed");
    CHECK(feed(o, TP_EV_CONTENT, "", NULL, NULL) == 0, "feed");
    CHECK(feed(o, TP_EV_CONTENT, "Sure.", NULL, NULL) == 0, "feed");
    CHECK(resp_out_text(o, " Calling.", 9) == 0, "text");
    CHECK(feed(o, TP_EV_TOOL_START, NULL, "call_a", "get_weather") == 0, "feed");
    CHECK(feed(o, TP_EV_TOOL_ARGS, "{\"city\": ", NULL, NULL) == 0, "feed");
    CHECK(feed(o, TP_EV_TOOL_ARGS, "\"Paris\"}", NULL, NULL) == 0, "feed");
    CHECK(feed(o, TP_EV_TOOL_START, NULL, "call_b", "get_time") == 0, "feed");
    CHECK(feed(o, TP_EV_TOOL_ARGS, "{}", NULL, NULL) == 0, "feed");
}

static const char *str_at(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = tok[0] >= '0' && tok[0] <= '9' ? cJSON_GetArrayItem(cur, atoi(tok))
                                             : cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static double num_at(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static bool str_is(const cJSON *o, const char *path, const char *want)
{
    const char *s = str_at(o, path);
    return s && !strcmp(s, want);
}

static void test_stream_events(void)
{
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    };
    const int n_want = (int)(sizeof want / sizeof *want);
    struct sink s = { 0 };
    struct resp_out o;
    resp_out_init(&o, &META, collect, &s);
    resp_out_start(&o);
    feed_all(&o);
    struct oai_usage u = { .prompt_tokens = 10, .completion_tokens = 7, .cached_tokens = 4, .reasoning_tokens = 3 };
    resp_out_finish(&o, RESP_COMPLETED, &u, NULL);
    CHECK(s.bad == 0, "%d events badly framed", s.bad);
    CHECK(s.n == n_want, "%d events, want %d", s.n, n_want);
    for (int i = 0; i < s.n && i < n_want; i++) {
        CHECK(!strcmp(s.type[i], want[i]), "event %d is %s, want %s", i, s.type[i], want[i]);
        CHECK(num_at(s.ev[i], "sequence_number") == i, "event %d numbered %g", i, num_at(s.ev[i], "sequence_number"));
    }
    if (s.n != n_want) goto out;
    CHECK(str_is(s.ev[0], "response.status", "in_progress") && str_is(s.ev[0], "response.id", "resp_test"),
          "created");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(s.ev[0], "response"),
                                                               "output")) == 0, "created with output");
    /* every item event names the item its added event opened, at its index */
    const char *item_id = NULL;
    int index = -1;
    for (int i = 2; i < s.n - 1; i++) {
        if (!strcmp(s.type[i], "response.output_item.added")) {
            item_id = str_at(s.ev[i], "item.id");
            index++;
            CHECK(str_is(s.ev[i], "item.status", "in_progress") || index == 0, "added %d status", index);
        } else if (!strcmp(s.type[i], "response.output_item.done")) {
            CHECK(item_id && str_is(s.ev[i], "item.id", item_id), "done event %d names another item", i);
        } else {
            CHECK(item_id && str_is(s.ev[i], "item_id", item_id), "event %d names another item", i);
        }
        CHECK(num_at(s.ev[i], "output_index") == index, "event %d at index %g, want %d", i,
              num_at(s.ev[i], "output_index"), index);
    }
    CHECK(index == 3, "%d items", index + 1);
    CHECK(str_is(s.ev[4], "delta", "Let me") && str_is(s.ev[6], "text", "Let me think."), "reasoning text");
    CHECK(str_is(s.ev[13], "text", "Sure. Calling.") && str_is(s.ev[14], "part.text", "Sure. Calling."),
          "message text");
    CHECK(str_is(s.ev[16], "item.call_id", "call_a") && str_is(s.ev[16], "item.name", "get_weather") &&
              str_is(s.ev[16], "item.arguments", "") && str_is(s.ev[16], "item.type", "function_call"),
          "call added");
    CHECK(str_is(s.ev[19], "arguments", "{\"city\": \"Paris\"}") && str_is(s.ev[19], "name", "get_weather"),
          "arguments done");
    CHECK(str_is(s.ev[20], "item.status", "completed") && str_is(s.ev[20], "item.id", str_at(s.ev[16], "item.id")),
          "call done");
    CHECK(!strncmp(str_at(s.ev[2], "item.id"), "rs_", 3) && !strncmp(str_at(s.ev[9], "item.id"), "msg_", 4) &&
              !strncmp(str_at(s.ev[16], "item.id"), "fc_", 3), "item id prefixes");
    /* the final response: status, echoed fields, the done items, usage */
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(s.ev[n_want - 1], "response");
    CHECK(str_is(r, "status", "completed") && str_is(r, "instructions", "Be brief.") &&
              num_at(r, "max_output_tokens") == 64 && str_is(r, "tool_choice", "auto") &&
              cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(r, "tools")) && str_is(r, "text.format.type", "text"),
          "final response fields");
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(r, "output");
    int done_at[] = { 8, 15, 20, 24 };
    for (int k = 0; k < 4; k++)
        CHECK(cJSON_Compare(cJSON_GetArrayItem(output, k),
                            cJSON_GetObjectItemCaseSensitive(s.ev[done_at[k]], "item"), true),
              "output[%d] is not the done item", k);
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(r, "usage");
    CHECK(num_at(usage, "input_tokens") == 10 && num_at(usage, "output_tokens") == 7 &&
              num_at(usage, "total_tokens") == 17 &&
              num_at(cJSON_GetObjectItemCaseSensitive(usage, "input_tokens_details"), "cached_tokens") == 4 &&
              num_at(cJSON_GetObjectItemCaseSensitive(usage, "output_tokens_details"), "reasoning_tokens") == 3,
          "usage");
out:
    resp_out_free(&o);
    sink_free(&s);
}

static cJSON *whole(const struct resp_out *o, enum resp_status st, const struct api_error *e)
{
    struct oai_usage u = { .prompt_tokens = 3, .completion_tokens = 2 };
    size_t len = 0;
    char *json = resp_out_json(o, st, &u, e, &len);
    CHECK(json && len == strlen(json), "resp_out_json");
    cJSON *r = json ? cJSON_Parse(json) : NULL;
    CHECK(r != NULL, "not JSON: %s", json ? json : "(null)");
    free(json);
    return r;
}

static void test_collected(void)
{
    struct resp_out o;
    resp_out_init(&o, &META, NULL, NULL);
    feed_all(&o);
    CHECK(o.n == 4, "%d items", o.n);
    cJSON *r = whole(&o, RESP_COMPLETED, NULL);
    CHECK(str_is(r, "object", "response") && str_is(r, "status", "completed") && cJSON_IsNull(
              cJSON_GetObjectItemCaseSensitive(r, "error")), "completed");
    CHECK(str_is(r, "output.0.type", "reasoning") && str_is(r, "output.0.content.0.text", "Let me think.") &&
              !cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "output"), 0),
                                                "status"),
          "reasoning item");
    CHECK(str_is(r, "output.1.type", "message") && str_is(r, "output.1.role", "assistant") &&
              str_is(r, "output.1.content.0.type", "output_text") &&
              str_is(r, "output.1.content.0.text", "Sure. Calling.") && str_is(r, "output.1.status", "completed"),
          "message item");
    CHECK(str_is(r, "output.3.name", "get_time") && str_is(r, "output.3.arguments", "{}") &&
              str_is(r, "output.3.call_id", "call_b"), "second call");
    cJSON_Delete(r);
    r = whole(&o, RESP_INCOMPLETE, NULL);
    CHECK(str_is(r, "status", "incomplete") && str_is(r, "incomplete_details.reason", "max_output_tokens") &&
              str_is(r, "output.3.status", "incomplete") && str_is(r, "output.2.status", "completed"),
          "incomplete");
    cJSON_Delete(r);
    struct api_error e;
    api_error_set(&e, 500, API_ERR_SERVER, NULL, NULL, "the engine failed");
    r = whole(&o, RESP_FAILED, &e);
    CHECK(str_is(r, "status", "failed") && str_is(r, "error.code", "server_error") &&
              str_is(r, "error.message", "the engine failed"), "failed");
    cJSON_Delete(r);
    /* a background response cancelled: its items so far, the last one cut off; no error
       even though the engine saw an abort */
    api_error_set(&e, 503, API_ERR_OVERLOADED, NULL, NULL, "the request was aborted");
    r = whole(&o, RESP_CANCELLED, &e);
    CHECK(str_is(r, "status", "cancelled") && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r, "error")) &&
              cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r, "incomplete_details")) &&
              str_is(r, "output.3.status", "incomplete") && str_is(r, "output.1.status", "completed") &&
              num_at(cJSON_GetObjectItemCaseSensitive(r, "usage"), "output_tokens") == 2,
          "cancelled");
    cJSON_Delete(r);
    /* a background response's snapshots: a status, no output or usage yet */
    for (enum resp_status st = RESP_QUEUED; st <= RESP_IN_PROGRESS; st++) {
        r = whole(&o, st, NULL);
        const cJSON *out = cJSON_GetObjectItemCaseSensitive(r, "output");
        CHECK(str_is(r, "status", resp_status_name(st)) && cJSON_IsArray(out) && cJSON_GetArraySize(out) == 0 &&
                  cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r, "usage")) &&
                  cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(r, "error")) && str_is(r, "id", "resp_test") &&
                  str_is(r, "instructions", "Be brief."),
              "%s snapshot", resp_status_name(st));
        cJSON_Delete(r);
    }
    CHECK(!strcmp(resp_status_name(RESP_QUEUED), "queued") && !strcmp(resp_status_name(RESP_IN_PROGRESS), "in_progress"),
          "status names");
    resp_out_free(&o);
}

static void test_failed_stream_and_bad_utf8(void)
{
    struct sink s = { 0 };
    struct resp_out o;
    resp_out_init(&o, &META, collect, &s);
    resp_out_start(&o);
    CHECK(resp_out_text(&o, "caf\xc3", 4) == 0 && resp_out_text(&o, "\xff!", 2) == 0, "text");
    struct api_error e;
    api_error_set(&e, 503, API_ERR_OVERLOADED, NULL, NULL, "the request was aborted");
    resp_out_finish(&o, RESP_FAILED, NULL, &e);
    CHECK(s.bad == 0 && s.n == 10, "%d events (%d bad)", s.n, s.bad);
    if (s.n == 10) {
        CHECK(!strcmp(s.type[9], "response.failed") && str_is(s.ev[9], "response.status", "failed") &&
                  str_is(s.ev[9], "response.error.message", "the request was aborted") &&
                  cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(
                      cJSON_GetObjectItemCaseSensitive(s.ev[9], "response"), "usage")),
              "failed event");
        const char *t = str_at(s.ev[6], "text");
        CHECK(t && !strcmp(t, "caf\xef\xbf\xbd\xef\xbf\xbd!"), "invalid bytes not replaced: %s", t ? t : "(null)");
    }
    resp_out_free(&o);
    sink_free(&s);
}

int main(void)
{
    RUN(test_stream_events);
    RUN(test_collected);
    RUN(test_failed_stream_and_bad_utf8);
    return test_summary();
}
