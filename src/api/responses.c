/* responses.c — the Responses API's response object and stream events (responses.h).
 * Text goes out through oai_json_string, as on the chat endpoint.
 */
#define _POSIX_C_SOURCE 200809L
#include "api/responses.h"
#include "api/openai_internal.h"
#include "util/err.h"
#include "util/grow.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void resp_out_init(struct resp_out *o, const struct resp_meta *meta, resp_sink_fn sink, void *ud)
{
    *o = (struct resp_out){ .meta = meta, .sink = sink, .ud = ud };
}

void resp_out_free(struct resp_out *o)
{
    for (int i = 0; i < o->n; i++) {
        free(o->items[i].call_id);
        free(o->items[i].name);
        free(o->items[i].text);
        free(o->items[i].lp);
    }
    free(o->items);
    *o = (struct resp_out){ 0 };
}

/* Adds v under key (v NULL: out of memory); false when it could not be added. */
static bool put(cJSON *obj, const char *key, cJSON *v)
{
    if (v && cJSON_AddItemToObject(obj, key, v)) return true;
    cJSON_Delete(v);
    return false;
}

/* The logprobs list of n tokens' lp (meta->top_logprobs alternatives each). */
static cJSON *logprobs_json(const struct resp_out *o, const struct req_logprob *lp, int n)
{
    return oai_token_logprobs(o->meta->m, lp, n, o->meta->top_logprobs);
}

/* An item's text part: output_text for a message, reasoning_text for reasoning. */
static cJSON *part_json(const struct resp_out *o, const struct resp_item *it, bool with_text)
{
    cJSON *p = cJSON_CreateObject();
    bool msg = it->kind == RESP_MESSAGE;
    bool ok = p && cJSON_AddStringToObject(p, "type", msg ? "output_text" : "reasoning_text") &&
              put(p, "text", oai_json_string(with_text ? it->text : "", with_text ? it->len : 0));
    if (ok && msg)
        ok = cJSON_AddArrayToObject(p, "annotations") && put(p, "logprobs", logprobs_json(o, it->lp, with_text ? it->n_lp : 0));
    if (ok) return p;
    cJSON_Delete(p);
    return NULL;
}

/* An output item; status NULL: none (reasoning items carry none). Not done: as an
 * output_item.added event shows it (no text yet). */
static cJSON *item_json(const struct resp_out *out, const struct resp_item *it, bool done, const char *status)
{
    cJSON *o = cJSON_CreateObject();
    static const char *const type[] = { "reasoning", "message", "function_call" };
    bool ok = o && cJSON_AddStringToObject(o, "id", it->id) && cJSON_AddStringToObject(o, "type", type[it->kind]);
    if (ok && it->kind == RESP_CALL)
        ok = cJSON_AddStringToObject(o, "call_id", it->call_id) && cJSON_AddStringToObject(o, "name", it->name) &&
             put(o, "arguments", oai_json_string(done ? it->text : "", done ? it->len : 0));
    if (ok && it->kind == RESP_MESSAGE) ok = cJSON_AddStringToObject(o, "role", "assistant");
    if (ok && it->kind == RESP_REASONING) ok = cJSON_AddArrayToObject(o, "summary") != NULL;
    if (ok && it->kind != RESP_CALL) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        cJSON *part = done && content ? part_json(out, it, true) : NULL;
        ok = content && (!done || (part && cJSON_AddItemToArray(content, part)));
        if (!ok) cJSON_Delete(part);
    }
    if (ok && status) ok = cJSON_AddStringToObject(o, "status", status) != NULL;
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *usage_json(const struct oai_usage *u)
{
    cJSON *o = cJSON_CreateObject(), *in = o ? cJSON_AddObjectToObject(o, "input_tokens_details") : NULL;
    cJSON *out = in ? cJSON_AddObjectToObject(o, "output_tokens_details") : NULL;
    if (out && cJSON_AddNumberToObject(o, "input_tokens", u->prompt_tokens) &&
        cJSON_AddNumberToObject(in, "cached_tokens", u->cached_tokens) &&
        cJSON_AddNumberToObject(in, "cache_write_tokens", 0) && /* no billed cache writes here */
        cJSON_AddNumberToObject(o, "output_tokens", u->completion_tokens) &&
        cJSON_AddNumberToObject(out, "reasoning_tokens", u->reasoning_tokens) &&
        cJSON_AddNumberToObject(o, "total_tokens", (double)u->prompt_tokens + u->completion_tokens))
        return o;
    cJSON_Delete(o);
    return NULL;
}

/* The default of an echoed request field that was left out (NULL: JSON null). */
static cJSON *echo_default(const char *key)
{
    if (!strcmp(key, "tools")) return cJSON_CreateArray();
    if (!strcmp(key, "tool_choice")) return cJSON_CreateString("auto");
    if (!strcmp(key, "parallel_tool_calls")) return cJSON_CreateTrue();
    if (!strcmp(key, "truncation")) return cJSON_CreateString("disabled");
    if (!strcmp(key, "metadata")) return cJSON_CreateObject();
    if (!strcmp(key, "text")) return cJSON_Parse("{\"format\":{\"type\":\"text\"}}");
    if (!strcmp(key, "store") || !strcmp(key, "background")) return cJSON_CreateFalse();
    return cJSON_CreateNull();
}

const char *resp_status_name(enum resp_status st)
{
    static const char *const name[] = { "completed", "incomplete", "failed", "cancelled", "queued", "in_progress" };
    return name[st];
}

/* The response object: while queued or in progress, no output or usage yet. */
static cJSON *response_json(const struct resp_out *o, enum resp_status st, const struct oai_usage *u,
                            const struct api_error *err)
{
    bool in_progress = st == RESP_QUEUED || st == RESP_IN_PROGRESS;
    const struct resp_meta *m = o->meta;
    cJSON *r = cJSON_CreateObject(), *echo = cJSON_Parse(m->echo ? m->echo : "{}");
    bool ok = r && echo && cJSON_AddStringToObject(r, "id", m->id) &&
              cJSON_AddStringToObject(r, "object", "response") &&
              cJSON_AddNumberToObject(r, "created_at", (double)m->created_at) &&
              cJSON_AddStringToObject(r, "status", resp_status_name(st)) &&
              cJSON_AddStringToObject(r, "model", m->model ? m->model : "");
    if (ok && !in_progress && st == RESP_FAILED && err) {
        cJSON *e = cJSON_AddObjectToObject(r, "error");
        ok = e && cJSON_AddStringToObject(e, "code", err->code ? err->code : err->type) &&
             cJSON_AddStringToObject(e, "message", err->message);
    } else if (ok) {
        ok = cJSON_AddNullToObject(r, "error") != NULL;
    }
    if (ok && !in_progress && st == RESP_INCOMPLETE) {
        cJSON *d = cJSON_AddObjectToObject(r, "incomplete_details");
        ok = d && cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else if (ok) {
        ok = cJSON_AddNullToObject(r, "incomplete_details") != NULL;
    }
    /* the request's fields, as given or their defaults */
    for (cJSON *f = echo ? echo->child : NULL; ok && f; f = f->next)
        ok = put(r, f->string, cJSON_IsNull(f) ? echo_default(f->string) : cJSON_Duplicate(f, true));
    cJSON *output = ok ? cJSON_AddArrayToObject(r, "output") : NULL;
    ok = output != NULL;
    for (int i = 0; ok && !in_progress && i < o->n; i++) {
        const char *s = o->items[i].kind == RESP_REASONING ? NULL
                        : (st == RESP_INCOMPLETE || st == RESP_CANCELLED) && i == o->n - 1 ? "incomplete"
                                                                                          : "completed";
        cJSON *it = item_json(o, &o->items[i], true, s);
        ok = it && cJSON_AddItemToArray(output, it);
        if (!ok) cJSON_Delete(it);
    }
    ok = ok && (in_progress || !u ? cJSON_AddNullToObject(r, "usage") != NULL : put(r, "usage", usage_json(u)));
    cJSON_Delete(echo);
    if (ok) return r;
    cJSON_Delete(r);
    return NULL;
}

/* A new event object {"type", "sequence_number"} (numbered even when it cannot be
 * made, so that a client sees the gap). */
static cJSON *event_new(struct resp_out *o, const char *type)
{
    cJSON *ev = cJSON_CreateObject();
    int seq = o->seq++;
    if (ev && cJSON_AddStringToObject(ev, "type", type) && cJSON_AddNumberToObject(ev, "sequence_number", seq))
        return ev;
    cJSON_Delete(ev);
    return NULL;
}

/* Frames ev (taken) as "event: TYPE\ndata: JSON\n\n" for the sink. ok false: ev is
 * incomplete (out of memory), the sink gets NULL. */
static void event_send(struct resp_out *o, cJSON *ev, bool ok)
{
    char *json = ok && ev ? cJSON_PrintUnformatted(ev) : NULL;
    const cJSON *type = ev ? cJSON_GetObjectItemCaseSensitive(ev, "type") : NULL;
    char *sse = NULL;
    if (json && cJSON_IsString(type)) {
        size_t n = strlen(type->valuestring) + strlen(json) + 18;
        if ((sse = malloc(n))) snprintf(sse, n, "event: %s\ndata: %s\n\n", type->valuestring, json);
    }
    free(json);
    cJSON_Delete(ev);
    o->sink(o->ud, sse);
}

/* An event about items[i]: {"item_id", "output_index"} after type and sequence_number. */
static cJSON *item_event(struct resp_out *o, const char *type, int i, bool *ok)
{
    cJSON *ev = event_new(o, type);
    *ok = ev && cJSON_AddStringToObject(ev, "item_id", o->items[i].id) &&
          cJSON_AddNumberToObject(ev, "output_index", i);
    return ev;
}

static void send_response_event(struct resp_out *o, const char *type, enum resp_status st,
                                const struct oai_usage *u, const struct api_error *err)
{
    cJSON *ev = event_new(o, type);
    event_send(o, ev, ev && put(ev, "response", response_json(o, st, u, err)));
}

void resp_out_start(struct resp_out *o)
{
    send_response_event(o, "response.created", RESP_IN_PROGRESS, NULL, NULL);
    send_response_event(o, "response.in_progress", RESP_IN_PROGRESS, NULL, NULL);
}

/* Streaming: output_item.added (and content_part.added) for the item just opened. */
static void send_opened(struct resp_out *o)
{
    int i = o->n - 1;
    const struct resp_item *it = &o->items[i];
    cJSON *ev = event_new(o, "response.output_item.added");
    event_send(o, ev, ev && cJSON_AddNumberToObject(ev, "output_index", i) &&
                          put(ev, "item", item_json(o, it, false, it->kind == RESP_REASONING ? NULL : "in_progress")));
    if (it->kind == RESP_CALL) return;
    bool ok;
    ev = item_event(o, "response.content_part.added", i, &ok);
    event_send(o, ev, ok && cJSON_AddNumberToObject(ev, "content_index", 0) && put(ev, "part", part_json(o, it, false)));
}

/* Streaming: the delta event for text just added to the open item (a message's: with
 * the logprobs of lp[0, n)). */
static void send_delta(struct resp_out *o, const char *text, size_t len, const struct req_logprob *lp, int n)
{
    int i = o->n - 1;
    enum resp_item_kind k = o->items[i].kind;
    static const char *const type[] = { "response.reasoning_text.delta", "response.output_text.delta",
                                        "response.function_call_arguments.delta" };
    bool ok;
    cJSON *ev = item_event(o, type[k], i, &ok);
    if (ok && k != RESP_CALL) ok = cJSON_AddNumberToObject(ev, "content_index", 0) != NULL;
    ok = ok && put(ev, "delta", oai_json_string(text, len));
    if (ok && k == RESP_MESSAGE) ok = put(ev, "logprobs", logprobs_json(o, lp, n));
    event_send(o, ev, ok);
}

/* Streaming: the done events of the open item, which ends with status. */
static void send_closed(struct resp_out *o, const char *status)
{
    int i = o->n - 1;
    const struct resp_item *it = &o->items[i];
    bool ok;
    cJSON *ev;
    if (it->kind == RESP_CALL) {
        ev = item_event(o, "response.function_call_arguments.done", i, &ok);
        event_send(o, ev, ok && cJSON_AddStringToObject(ev, "name", it->name) &&
                              put(ev, "arguments", oai_json_string(it->text, it->len)));
    } else {
        ev = item_event(o, it->kind == RESP_MESSAGE ? "response.output_text.done" : "response.reasoning_text.done",
                        i, &ok);
        ok = ok && cJSON_AddNumberToObject(ev, "content_index", 0) && put(ev, "text", oai_json_string(it->text, it->len));
        if (ok && it->kind == RESP_MESSAGE) ok = put(ev, "logprobs", logprobs_json(o, it->lp, it->n_lp));
        event_send(o, ev, ok);
        ev = item_event(o, "response.content_part.done", i, &ok);
        event_send(o, ev, ok && cJSON_AddNumberToObject(ev, "content_index", 0) && put(ev, "part", part_json(o, it, true)));
    }
    ev = event_new(o, "response.output_item.done");
    event_send(o, ev, ev && cJSON_AddNumberToObject(ev, "output_index", i) &&
                          put(ev, "item", item_json(o, it, true, it->kind == RESP_REASONING ? NULL : status)));
}

/* Ends the open item, if any. */
static void close_open(struct resp_out *o, const char *status)
{
    if (!o->open) return;
    o->open = false;
    if (o->sink) send_closed(o, status);
}

/* Starts an item of kind k (a call: with its id and name). */
static int open_item(struct resp_out *o, enum resp_item_kind k, const char *call_id, const char *name)
{
    size_t cap = (size_t)o->cap;
    if (!grow_array((void **)&o->items, &cap, (size_t)o->n + 1, sizeof *o->items)) return ERR_NOMEM;
    o->cap = (int)cap;
    struct resp_item *it = &o->items[o->n];
    *it = (struct resp_item){ .kind = k };
    if (k == RESP_CALL && (!(it->call_id = strdup(call_id)) || !(it->name = strdup(name)))) {
        free(it->call_id);
        return ERR_NOMEM;
    }
    static const char *const prefix[] = { "rs_", "msg_", "fc_" };
    oai_make_id(prefix[k], it->id, sizeof it->id);
    o->n++;
    o->open = true;
    if (o->sink) send_opened(o);
    return 0;
}

/* Appends text to the open item; a message's takes the take's logprobs not yet placed. */
static int add_text(struct resp_out *o, const char *text, size_t len)
{
    struct resp_item *it = &o->items[o->n - 1];
    if (!grow_array((void **)&it->text, &it->cap, it->len + len + 1, 1)) return ERR_NOMEM;
    const struct req_logprob *lp = NULL;
    int n = 0;
    if (it->kind == RESP_MESSAGE && o->meta->top_logprobs >= 0 && o->take_n > 0) {
        size_t cap = (size_t)it->lp_cap;
        if (!grow_array((void **)&it->lp, &cap, (size_t)(it->n_lp + o->take_n), sizeof *it->lp)) return ERR_NOMEM;
        it->lp_cap = (int)cap;
        memcpy(it->lp + it->n_lp, o->take_lp, sizeof *it->lp * (size_t)o->take_n);
        it->n_lp += o->take_n;
        lp = o->take_lp;
        n = o->take_n;
        o->take_n = 0;
    }
    if (len > 0) memcpy(it->text + it->len, text, len);
    it->len += len;
    it->text[it->len] = '\0';
    if (o->sink) send_delta(o, text, len, lp, n);
    return 0;
}

void resp_out_take_begin(struct resp_out *o, const struct req_logprob *lp, int n)
{
    o->take_lp = lp;
    o->take_n = o->meta->top_logprobs >= 0 ? n : 0;
}

int resp_out_take_end(struct resp_out *o, bool all_content)
{
    int rc = 0;
    if (o->take_n > 0 && all_content) {
        if (!o->open || o->items[o->n - 1].kind != RESP_MESSAGE) {
            close_open(o, "completed");
            rc = open_item(o, RESP_MESSAGE, NULL, NULL);
        }
        if (!rc) rc = add_text(o, "", 0);
    }
    o->take_lp = NULL;
    o->take_n = 0;
    return rc;
}

int resp_out_event(void *ud, const struct tparse_event *ev)
{
    struct resp_out *o = ud;
    if (ev->kind == TP_EV_TOOL_START) {
        close_open(o, "completed");
        return open_item(o, RESP_CALL, ev->id ? ev->id : "", ev->name ? ev->name : "");
    }
    if (ev->len == 0) return 0;
    enum resp_item_kind k = ev->kind == TP_EV_REASONING ? RESP_REASONING
                            : ev->kind == TP_EV_TOOL_ARGS ? RESP_CALL : RESP_MESSAGE;
    if (!o->open || o->items[o->n - 1].kind != k) {
        if (k == RESP_CALL) return 0; /* arguments without their call: the parser never sends them */
        close_open(o, "completed");
        int rc = open_item(o, k, NULL, NULL);
        if (rc) return rc;
    }
    return add_text(o, ev->text, ev->len);
}

int resp_out_text(struct resp_out *o, const char *text, size_t len)
{
    struct tparse_event ev = { .kind = TP_EV_CONTENT, .text = text, .len = len };
    return resp_out_event(o, &ev);
}

void resp_out_finish(struct resp_out *o, enum resp_status st, const struct oai_usage *u,
                     const struct api_error *err)
{
    close_open(o, st == RESP_INCOMPLETE ? "incomplete" : "completed");
    static const char *const type[] = { "response.completed", "response.incomplete", "response.failed" };
    if (o->sink && st <= RESP_FAILED) send_response_event(o, type[st], st, u, err);
}

char *resp_out_json(const struct resp_out *o, enum resp_status st, const struct oai_usage *u,
                    const struct api_error *err, size_t *len)
{
    cJSON *r = response_json(o, st, u, err);
    char *s = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    if (s && len) *len = strlen(s);
    return s;
}
